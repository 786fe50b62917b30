"""`kernel:P`: the scheduling of weave_kernel's megakernel under its policy P, for validation against it.

The megakernel differs from the idealised policies in ways that change its timeline:
- `kernel:sequential`: phases inside one persistent launch, separated by grid barriers (no host sync);
- `kernel:static:C`: C CTAs dispatch and then idle; compute CTAs push each row block's results to the
  source straight from the GEMM1 epilogue (combine is pipelined per row block, by compute SMs);
- `kernel:weave` / `kernel:weave@c0,c1,..` / `kernel:weave:C` / `kernel:weave:c0,c1,..`: (c*, K*) from the same
  cost table as `weave` (or the split a measured `weave` run recorded, one C per GPU; or a fixed C, or one
  fixed C per GPU), the combine in the epilogue as above, and comm CTAs stealing GEMM tiles after dispatch.
  The decision is made after the count exchange by the CTAs below the table's max_comm_sms under `weave`
  (the others start at once), by CTA 0 alone under a fixed C; with the option kernel_deciders='all' (kernels
  before 9caebac) by every CTA, which all wait for it;
- `kernel:weave-nosteal` (`@c0,c1,..`, `:C`): the same split, comm CTAs idle after dispatch (no stealing).
Row blocks per (expert, source) segment and pair-based dispatch are properties of the workload given to the
engine (a validation run rebuilds it from the counts the kernel exchanged), not of this policy.
"""
from __future__ import annotations

from ... import costmodel
from ...costtable import table_for
from ...profile import table_profile
from ..plan import Plan


def _row_blocks(ctx) -> tuple[int, ...]:
    """One combine chunk per row block of each GPU (the epilogue pushes every block on its own); with
    `segment_pad_rows` a block never spans two sources, as in the kernel's receive layout."""
    w, tile = ctx.workload, ctx.options.tile_rows
    out = []
    for g in range(ctx.num_gpus):
        rows = w.pair_counts[:, g, w.placement.local_experts(g)]  # [source, local expert]
        if ctx.options.segment_pad_rows is None:
            rows = rows.sum(axis=0)
        out.append(max(1, int((-(-rows // tile)).sum())))
    return tuple(out)


def _ints(spec: str, text: str) -> tuple[int, ...]:
    """Comma-separated comm CTA counts of a `kernel:` spec, with a clear error for anything else."""
    try:
        return tuple(int(c) for c in text.split(","))
    except ValueError:
        raise ValueError(f"kernel:{spec}: comm CTA counts must be integers, got {text!r}") from None


def plan(ctx, spec: str) -> Plan:
    name, _, arg = spec.partition(":")
    G, chunks = ctx.num_gpus, _row_blocks(ctx)
    if name == "sequential" and not arg:
        return Plan("kernel:sequential", (ctx.profile.num_sms,) * G, (1,) * G, sequential=True, fused=True)
    if name == "static" and arg:
        c = _ints(spec, arg)
        if len(c) != 1:
            raise ValueError(f"kernel:{spec}: kernel:static takes one C for every GPU")
        return Plan(f"kernel:static:{c[0]}", c * G, chunks, combine_in_epilogue=True)
    name, at, recorded = name.partition("@")
    if at and not recorded:
        raise ValueError(f"kernel:{spec}: '@' needs the recorded choices after it, e.g. kernel:{name}@8,12")
    if name in ("weave", "weave-nosteal") and not (at and arg):
        given = arg or recorded
        if given:  # one C for every GPU, or one per GPU (@c0,c1,...: the choices a kernel run recorded)
            comm = _ints(spec, given)
            comm = comm * G if len(comm) == 1 else comm
            if len(comm) != G:
                raise ValueError(f"kernel:{spec}: give one C or {G} comma-separated values")
        else:  # the kernel's choice, from the table it reads (an FP8 layer's: the bf16 one, table_profile)
            tp = table_profile(ctx.profile)
            vol = costmodel.Volumes.from_workloads([ctx.workload], tp)
            comm = tuple(int(c) for c in costmodel.choose(vol, tp).num_comm_sms[0])
        N = ctx.profile.num_sms
        deciders = 1 if arg else min(table_for(ctx.profile).max_comm_sms, N)  # fixed C: CTA 0, for the record
        every_sm = ctx.options.kernel_deciders == "all"  # () = charged in the count exchange, every SM waits
        return Plan(f"kernel:{spec}", comm, chunks, steal=name == "weave", combine_in_epilogue=True,
                    decision_ns=ctx.profile.fixed_ns["decision"], decision_sms=() if every_sm else (deciders,) * G)
    raise ValueError(f"kernel:{spec}: expected kernel:sequential, kernel:static:C, kernel:weave, kernel:weave:C, "
                     "kernel:weave@c0,c1,.. or kernel:weave-nosteal")


def run(ctx, arg):
    if not arg:
        raise ValueError("kernel needs the megakernel's policy, e.g. kernel:static:8 or kernel:weave")
    return ctx.simulate(plan(ctx, arg))
