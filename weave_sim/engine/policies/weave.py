"""`weave`: per-layer, per-GPU (c*, K*) from the analytic cost model, plus temporal scheduling.

Spatial: `costmodel.choose` on this layer's volumes (the in-kernel decision costs `fixed_ns['decision']`,
added to the count exchange). Temporal: chunk pipelining (K* combine chunks, each starting when its GEMMs
end), bubble stealing (comm SMs claim GEMM tasks whenever no comm task is ready) and every SM joining
the final combine once the GPU's last GEMM task is claimed.
"""
from __future__ import annotations

from ... import costmodel
from ..plan import Plan


def plan(ctx) -> Plan:
    vol = costmodel.Volumes.from_workloads([ctx.workload], ctx.profile)
    chunks = tuple(k for k in costmodel.DEFAULT_CHUNKS if k in ctx.profile.chunk_eff)
    choice = costmodel.choose(vol, ctx.profile, chunks=chunks)
    return Plan("weave", tuple(choice.num_comm_sms[0]), tuple(choice.num_chunks[0]), steal=True,
                all_join_combine=True, decision_ns=ctx.profile.fixed_ns["decision"])


def uniform(ctx, num_comm_sms: int, num_chunks: int) -> Plan:
    """Weave's temporal scheduling with one (c, K) on every GPU (the oracle's search points)."""
    G = ctx.num_gpus
    return Plan(f"weave[c={num_comm_sms},K={num_chunks}]", (num_comm_sms,) * G, (num_chunks,) * G, steal=True,
                all_join_combine=True, decision_ns=ctx.profile.fixed_ns["decision"])


def run(ctx, arg):
    if arg:
        raise ValueError("weave takes no argument")
    return ctx.simulate(plan(ctx))
