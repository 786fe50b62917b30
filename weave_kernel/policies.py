"""Launch policies: how a call splits the CTAs. A new policy is one function and one registry line.

- `sequential`: every CTA runs every phase; grid barriers separate dispatch | GEMM0 | GEMM1 | combine.
- `static:C`: CTAs [0, C) dispatch, the others run GEMM tiles (baseline (c), DeepEP-style fixed split).
- `weave`: the kernel picks (c*, K*) per call and rank from weave_sim's cost table right after the count
  exchange; CTAs [0, c*) dispatch, then steal GEMM tiles from the same ticket (bubble stealing).
- `weave:C`: the same scheduling with C comm CTAs fixed (the measured c-sweep); (c*, K*) is still computed
  and recorded.
- `weave-nosteal`: the split `weave` chooses, without bubble stealing: the comm CTAs idle after their dispatch as
  under `static:C` (the per-layer choice alone; stealing slowed compute-bound layers at the power cap,
  docs/kernel.md "Stealing at the power cap").
"""
from __future__ import annotations

from dataclasses import dataclass

POLICY_SEQUENTIAL = 0  # mirrors weave::kPolicySequential in csrc/params.h
POLICY_STATIC = 1      # mirrors weave::kPolicyStatic
POLICY_WEAVE = 2       # mirrors weave::kPolicyWeave


@dataclass(frozen=True)
class LaunchPolicy:
    """A resolved policy. policy_id: kernel enum; num_comm_ctas: CTAs that dispatch (0 for sequential)."""

    name: str
    policy_id: int
    num_comm_ctas: int  # weave: 0 = chosen in the kernel
    steal: bool = True  # weave: comm CTAs claim GEMM tiles after their dispatch (Params::steal)

    @property
    def needs_cost_table(self) -> bool:
        return self.policy_id == POLICY_WEAVE


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


def _weave(arg: str | None, num_ctas: int) -> LaunchPolicy:
    if num_ctas < 2:
        raise ValueError(f"policy 'weave' needs at least 2 CTAs, the grid has {num_ctas}")
    if arg is None:
        return LaunchPolicy("weave", POLICY_WEAVE, 0)
    try:
        c = int(arg)
    except ValueError:
        raise ValueError(f"policy 'weave:C' needs an integer C, got {arg!r}") from None
    if not 1 <= c < num_ctas:
        raise ValueError(f"weave:{c}: C must be in [1, {num_ctas - 1}] on a grid of {num_ctas} CTAs")
    return LaunchPolicy(f"weave:{c}", POLICY_WEAVE, c)


def _weave_nosteal(arg: str | None, num_ctas: int) -> LaunchPolicy:
    if arg:
        raise ValueError("policy 'weave-nosteal' takes no argument (with C fixed it is static:C)")
    split = _weave(None, num_ctas)  # the same grid checks as weave
    return LaunchPolicy("weave-nosteal", split.policy_id, split.num_comm_ctas, steal=False)


POLICIES = {"sequential": _sequential, "static": _static, "weave": _weave, "weave-nosteal": _weave_nosteal}


def parse_policy(spec: str, num_ctas: int) -> LaunchPolicy:
    """'sequential', 'static:C', 'weave', 'weave:C' or 'weave-nosteal' -> LaunchPolicy; unknown names raise
    ValueError."""
    name, sep, arg = spec.partition(":")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {spec!r}; known: sequential, static:C, weave, weave:C, weave-nosteal")
    if sep and not arg:
        raise ValueError(f"policy {spec!r}: empty argument after ':'")
    return POLICIES[name](arg or None, num_ctas)


DISPATCH_MODES = ("threads", "bulk")  # "bulk:W" also: W issuing warps (Params::dispatch_bulk, csrc/params.h)
BULK_ISSUERS = 8                      # "bulk": issuing warps per CTA
MAX_BULK_ISSUERS = 12                 # weave::kMaxDispatchIssuers (csrc/params.h: the CTA's warps)


def dispatch_issuers(dispatch: str) -> int:
    """Params::dispatch_bulk of a dispatch mode: 0 for "threads", the issuing warps for "bulk" / "bulk:W"."""
    if dispatch == "threads":
        return 0
    if dispatch == "bulk":
        return BULK_ISSUERS
    head, _, w = str(dispatch).partition(":")
    if head == "bulk" and w.isdigit() and 1 <= int(w) <= MAX_BULK_ISSUERS:
        return int(w)
    raise ValueError(f"dispatch must be one of {DISPATCH_MODES} or bulk:W with 1 <= W <= {MAX_BULK_ISSUERS}, "
                     f"got {dispatch!r}")
