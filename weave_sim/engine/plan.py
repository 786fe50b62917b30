"""A plan: everything a policy decides for one layer, and nothing the hardware decides.

The engine simulates a Plan; a policy produces one Plan (or, like `oracle`, many and keeps the fastest).
"""
from __future__ import annotations

from dataclasses import dataclass

#: The most combine chunks (K) a policy spec (static:C:K) may ask for on a GPU. K cuts a GPU's GEMM row blocks into K
#: groups whose combine starts as each group's GEMMs end; the kernel chooses among 1, 2, 4 and 8
#: (costtable.DEFAULT_CHUNKS), so a few hundred is far beyond anything it runs, and the engine builds tasks per chunk
#: and GPU (a huge K only exhausts memory). Plans a policy derives from the layer itself (kernel:*, one chunk per row
#: block) are not bound by it.
MAX_CHUNKS = 256


@dataclass(frozen=True)
class Plan:
    """Scheduling decisions for one layer on G GPUs.

    label: human-readable name of this configuration (e.g. 'static:20', 'weave', 'oracle[c=24,K=4]').
    num_comm_sms: tuple[int] [G]; SMs 0..c-1 of GPU g are communication workers, the rest compute workers.
        Ignored when `sequential` (every SM is then an any-role worker).
    num_chunks: tuple[int] [G]; K, the number of combine chunks on GPU g (chunk pipelining: a chunk's
        combine transfers start when all GEMM tiles of that chunk are done). K=1 means combine after all GEMMs.
    steal: bubble stealing; comm workers claim GEMM tasks whenever no comm task is ready.
    all_join_combine: once every GEMM task of a GPU is claimed, its compute workers also push combine rows.
    sequential: no overlap (NCCL all-to-all + grouped GEMM): host sync and a launch before dispatch, a launch
        before the GEMMs (after the GPU's dispatch traffic, both directions, is complete), a launch before combine.
    decision_ns: time of an in-kernel decision (Weave's spatial scheduler), charged inside the count-exchange
        task (every SM waits for it), or with `decision_sms` only to those SMs.
    decision_sms: () or, per GPU, how many SMs (0..n-1) make the decision after the count exchange; the other
        SMs start at once (the megakernel's `weave`: the CTAs below the cost table's max_comm_sms; weave:C:
        CTA 0 alone, for the record).
    fused: with `sequential`, the phases run inside one persistent launch (the megakernel's `sequential`):
        phase boundaries cost a grid barrier instead of a host sync and kernel launches.
    combine_in_epilogue: compute SMs push a row block's results as soon as they are ready, ahead of new
        GEMM work, as the megakernel's GEMM1 epilogue does (pair it with one combine chunk per row block).
    """

    label: str
    num_comm_sms: tuple[int, ...]
    num_chunks: tuple[int, ...]
    steal: bool = False
    all_join_combine: bool = False
    sequential: bool = False
    decision_ns: int = 0
    decision_sms: tuple[int, ...] = ()
    fused: bool = False
    combine_in_epilogue: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_comm_sms", tuple(int(c) for c in self.num_comm_sms))
        object.__setattr__(self, "num_chunks", tuple(int(k) for k in self.num_chunks))
        object.__setattr__(self, "decision_sms", tuple(int(n) for n in self.decision_sms))
        if self.decision_sms and len(self.decision_sms) != len(self.num_comm_sms):
            raise ValueError("plan: decision_sms needs one entry per GPU (or none)")
        if len(self.num_comm_sms) != len(self.num_chunks):
            raise ValueError("plan: num_comm_sms and num_chunks need one entry per GPU")
        if any(k < 1 for k in self.num_chunks):
            raise ValueError(f"plan {self.label}: num_chunks must be >= 1, got {self.num_chunks}")

    @property
    def num_gpus(self) -> int:
        return len(self.num_comm_sms)

    def check(self, num_sms: int) -> None:
        """Raise ValueError unless every GPU keeps at least one comm and one compute SM."""
        if not self.sequential and any(not 1 <= c < num_sms for c in self.num_comm_sms):
            raise ValueError(f"plan {self.label}: comm SMs must lie in [1, {num_sms - 1}], got {self.num_comm_sms}")

    def to_dict(self) -> dict:
        return {
            "label": self.label, "num_comm_sms": list(self.num_comm_sms), "num_chunks": list(self.num_chunks),
            "steal": self.steal, "all_join_combine": self.all_join_combine, "sequential": self.sequential,
            "decision_ns": self.decision_ns, "decision_sms": list(self.decision_sms), "fused": self.fused, "combine_in_epilogue": self.combine_in_epilogue,
        }
