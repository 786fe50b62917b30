"""Policy registry: name -> run(ctx, arg) returning a LayerResult.

A policy spec is 'name' or 'name:arg' (e.g. 'static:20', 'static:20:4'); `arg` is the text after the first
colon, or None. A new policy is one module with a `run(ctx, arg)` function and one line below.
`ctx` is a `weave_sim.engine.run.SimContext`: it holds the layer, the profile and the run options, and
`ctx.simulate(plan)` simulates one Plan.
"""
from __future__ import annotations

from . import kernel, oracle, sequential, static, weave

POLICIES = {
    "sequential": sequential.run,
    "static": static.run,
    "weave": weave.run,
    "oracle": oracle.run,
    "kernel": kernel.run,
}


def parse_policy(spec: str):
    """Split 'name[:arg]' and return (run function, arg); unknown names raise ValueError listing the known."""
    name, sep, arg = spec.partition(":")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {spec!r}; known: {', '.join(policy_names())} (static takes ':C[:K]')")
    if sep and not all(arg.split(":")):  # 'weave:', 'static:', 'kernel:weave:' (the kernel's parse_policy agrees)
        raise ValueError(f"policy {spec!r}: empty argument after ':'; drop the ':' or give the argument "
                         "(static:C[:K], oracle:fast, kernel:P)")
    return POLICIES[name], (arg or None)


def policy_names() -> list[str]:
    return list(POLICIES)
