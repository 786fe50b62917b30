"""`sequential`: no overlap, like NCCL all-to-all + grouped GEMM (SGLang's baseline).

Every SM may run any task, but barriers serialise the phases on each GPU: count exchange, host sync and a
launch; dispatch (every SM pushes); a launch once all dispatch traffic into and out of the GPU is done;
the GEMMs; a launch once they are all done; combine; reduction.
"""
from __future__ import annotations

from ..plan import Plan


def plan(ctx) -> Plan:
    G, N = ctx.num_gpus, ctx.profile.num_sms
    return Plan("sequential", (N,) * G, (1,) * G, sequential=True)


def run(ctx, arg):
    if arg:
        raise ValueError("sequential takes no argument")
    return ctx.simulate(plan(ctx))
