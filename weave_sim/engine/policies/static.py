"""`static:C[:K]`: C comm SMs on every GPU for every layer (DeepEP's 20, compile-time splits).

Comm SMs dispatch, combine and help with the reduction; compute SMs run GEMM tiles as soon as their rows
arrive. No bubble stealing; combine starts after all GEMMs (K=1) unless K is given.
"""
from __future__ import annotations

from ..plan import MAX_CHUNKS, Plan


def plan(ctx, num_comm_sms: int, num_chunks: int = 1) -> Plan:
    label = f"static:{num_comm_sms}" + (f":{num_chunks}" if num_chunks != 1 else "")
    return Plan(label, (num_comm_sms,) * ctx.num_gpus, (num_chunks,) * ctx.num_gpus)


def run(ctx, arg):
    if not arg:
        raise ValueError("static needs a comm SM count, e.g. static:20 or static:20:4")
    try:
        parts = [int(x) for x in arg.split(":")]
    except ValueError:
        raise ValueError(f"static:{arg}: C and K must be integers, e.g. static:20 or static:20:4") from None
    if len(parts) > 2:
        raise ValueError(f"static:{arg}: expected static:C or static:C:K")
    if len(parts) == 2 and not 1 <= parts[1] <= MAX_CHUNKS:
        raise ValueError(f"static:{arg}: K (combine chunks per GPU) must lie in [1, {MAX_CHUNKS}], got {parts[1]} "
                         "(the kernel chooses among 1, 2, 4 and 8)")
    return ctx.simulate(plan(ctx, *parts))
