"""Launch policies: how a call splits the CTAs. A new policy is one function and one registry line.

- `sequential`: every CTA runs every phase; grid barriers separate dispatch | GEMM0 | GEMM1 | combine.
- `static:C`: CTAs [0, C) dispatch, the others run GEMM tiles (baseline (c), DeepEP-style fixed split).
Per-call choice of C, chunking and tile stealing (the next issue) plug in here.
"""
from __future__ import annotations

from dataclasses import dataclass

POLICY_SEQUENTIAL = 0  # mirrors weave::kPolicySequential in csrc/params.h
POLICY_STATIC = 1      # mirrors weave::kPolicyStatic


@dataclass(frozen=True)
class LaunchPolicy:
    """A resolved policy. policy_id: kernel enum; num_comm_ctas: CTAs that dispatch (0 for sequential)."""

    name: str
    policy_id: int
    num_comm_ctas: int


def _sequential(arg: str | None, num_ctas: int) -> LaunchPolicy:
    if arg:
        raise ValueError("policy 'sequential' takes no argument")
    return LaunchPolicy("sequential", POLICY_SEQUENTIAL, 0)


def _static(arg: str | None, num_ctas: int) -> LaunchPolicy:
    try:
        c = int(arg or "")
    except ValueError:
        raise ValueError(f"policy 'static:C' needs an integer C, got {arg!r}") from None
    if not 1 <= c < num_ctas:
        raise ValueError(f"static:{c}: C must be in [1, {num_ctas - 1}] on a grid of {num_ctas} CTAs")
    return LaunchPolicy(f"static:{c}", POLICY_STATIC, c)


POLICIES = {"sequential": _sequential, "static": _static}


def parse_policy(spec: str, num_ctas: int) -> LaunchPolicy:
    """'sequential' or 'static:C' -> LaunchPolicy; unknown names raise ValueError listing the known ones."""
    name, _, arg = spec.partition(":")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {spec!r}; known: sequential, static:C")
    return POLICIES[name](arg or None, num_ctas)
