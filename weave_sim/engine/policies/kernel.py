"""`kernel:P`: the scheduling of weave_kernel's megakernel under its policy P, for validation against it.

The megakernel differs from the idealised policies in ways that change its timeline:
- `kernel:sequential`: phases inside one persistent launch, separated by grid barriers (no host sync);
- `kernel:static:C`: C CTAs dispatch and then idle; compute CTAs push each row block's results to the
  source straight from the GEMM1 epilogue (combine is pipelined per row block, by compute SMs);
- `kernel:weave` / `kernel:weave:C` / `kernel:weave:c0,c1,..`: (c*, K*) from the same cost table as
  `weave` (or fixed C, or one C per GPU such as the choice a measured run recorded), the
  combine in the epilogue as above, and comm CTAs stealing GEMM tiles after dispatch;
- `kernel:weave-nosteal` (`:c0,c1,..`): the same split, comm CTAs idle after dispatch (no stealing).
Row blocks per (expert, source) segment and pair-based dispatch are properties of the workload given to the
engine (a validation run rebuilds it from the counts the kernel exchanged), not of this policy.
"""
from __future__ import annotations

from ... import costmodel
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


def plan(ctx, spec: str) -> Plan:
    name, _, arg = spec.partition(":")
    G, chunks = ctx.num_gpus, _row_blocks(ctx)
    if name == "sequential" and not arg:
        return Plan("kernel:sequential", (ctx.profile.num_sms,) * G, (1,) * G, sequential=True, fused=True)
    if name == "static" and arg:
        return Plan(f"kernel:static:{int(arg)}", (int(arg),) * G, chunks, combine_in_epilogue=True)
    if name in ("weave", "weave-nosteal"):
        if arg:  # one C for every GPU, or one per GPU (c0,c1,...: e.g. the choices a kernel run recorded)
            comm = tuple(int(c) for c in arg.split(","))
            comm = comm * G if len(comm) == 1 else comm
            if len(comm) != G:
                raise ValueError(f"kernel:{name}:{arg}: give one C or {G} comma-separated values")
        else:
            vol = costmodel.Volumes.from_workloads([ctx.workload], ctx.profile)
            comm = tuple(int(c) for c in costmodel.choose(vol, ctx.profile).num_comm_sms[0])
        return Plan(f"kernel:{name}{':' + arg if arg else ''}", comm, chunks, steal=name == "weave",
                    combine_in_epilogue=True, decision_ns=ctx.profile.fixed_ns["decision"])
    raise ValueError(f"kernel:{spec}: expected kernel:sequential, kernel:static:C, kernel:weave, kernel:weave:C or "
                     "kernel:weave-nosteal")


def run(ctx, arg):
    if not arg:
        raise ValueError("kernel needs the megakernel's policy, e.g. kernel:static:8 or kernel:weave")
    return ctx.simulate(plan(ctx, arg))
