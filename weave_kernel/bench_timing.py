"""The benchmark's timing: ranks synchronised before every repetition, policies interleaved, the sustained view (every
function back to back, gpu_state), the A/B of two kernel versions in alternation, and CUDA-graph replays (bench.py)."""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from .gpu_state import sustained_calls, sustained_ms
from .symm import cuda_time_ms, interleaved_time_ms


def sync_ranks() -> None:
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()


def time_call(fn, warmup: int, repeats: int, calls: int = 1) -> float:
    """Median milliseconds of one fn() on this rank; ranks are synchronised before every repetition, and a
    repetition times `calls` back-to-back calls (as a model runs its layers), so that the host's launch skew
    between ranks, which the first call of a repetition absorbs, is amortised."""
    return cuda_time_ms(fn, warmup, repeats, calls, before=sync_ranks)


def time_policies(fns: dict, args) -> dict:
    """{name: median ms on this rank} for every function of one configuration, in args.order."""
    if args.order in ("interleaved", "alternating", "shuffled"):
        return interleaved_time_ms(fns, args.warmup, args.repeats, args.calls_per_rep, before=sync_ranks,
                                   alternate=args.order == "alternating",
                                   shuffle_seed=args.seed if args.order == "shuffled" else None)
    return {name: time_call(fn, args.warmup, args.repeats, args.calls_per_rep) for name, fn in fns.items()}


def warm_gpu(seconds: float, dev) -> None:
    """Busy the GPU for `seconds` with bf16 matmuls so the first configuration is not timed while clocks ramp."""
    if seconds <= 0:
        return
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    dist.barrier()


def max_over_ranks(v: float) -> float:
    t = torch.tensor([v], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def host_us_per_call(fn, calls: int = 8) -> float:
    """Microseconds the host takes to issue one eager call (checks, parameters, TMA descriptors, launch), timed
    over `calls` calls issued back to back without a sync; the GPU runs them behind."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / calls * 1e6


def graph_of(fn):
    """(replay, output): fn (one layer call, check=False) captured in a CUDA graph and replayed once; output is the
    tensor each replay writes (the caller compares it with the reference; kernel errors surface at the
    benchmark's raise_if_error after timing). Every rank captures the same calls in the same order (a capture
    runs nothing, so the device epoch counters stay in step)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fn()
    g.replay()
    torch.cuda.synchronize()
    return g.replay, y


def sustained_times(fns: dict, args, world: int, sampler=None) -> dict:
    """--sustained: every function back to back for about args.sustained seconds after 0.5 s idle, in the order
    given and then in reverse (the GPU warms over the sequence: the mean of the two passes cancels a steady
    drift); the same call count on every rank. Returns sustained_ms (slowest rank, mean of the passes) and
    sustained_gpu_state (per pass, per rank)."""
    times = {name: [] for name in fns}
    states = {name: [] for name in fns}
    for order in (list(fns), list(fns)[::-1]):
        for name in order:
            fn = fns[name]
            calls = sustained_calls(fn, args.sustained, agree=lambda n: int(max_over_ranks(n)))
            dist.barrier()
            t, s0, s1 = sustained_ms(fn, args.sustained, idle_s=0.5, calls=calls)
            times[name].append(max_over_ranks(t))
            if sampler is not None:
                state = [None] * world
                dist.all_gather_object(state, sampler.summary(s0, s1))
                states[name].append(state)
    out = {"sustained_ms": {n: float(np.mean(t)) for n, t in times.items()},
           "sustained_ms_passes": times}
    if sampler is not None:
        out["sustained_gpu_state"] = states
    return out


def ab_times(layer, other, pol: str, inputs, y_ref, args, kshared: dict | None = None) -> dict:
    """--ab-csrc: the other kernel version (B) checked against the reference, then A (the package's kernel) and B
    timed in alternation, one warm-up call before each repetition of each, so that both see the same GPU state:
    A then B, then B then A (interleaved_time_ms's alternate; before 2026-12-03 A always went first, and B ran
    right after A's calls), medians over pairs of rounds (args.repeats rounded up to even), slowest rank.
    kshared: the shared expert's call arguments (--shared), the same for both versions."""
    kshared = kshared or {}
    y = other(*inputs, policy=pol, **kshared)  # checked call
    err = float((y.float() - y_ref.float()).norm() / y_ref.float().norm())
    b_choice = None
    if pol == "weave":  # B's own (c*, K*) per rank (another cost table may choose another split)
        b_choice = [None] * dist.get_world_size()
        dist.all_gather_object(b_choice, other.last_choice())
    fa = lambda: layer(*inputs, policy=pol, check=False, **kshared)  # noqa: E731
    fb = lambda: other(*inputs, policy=pol, check=False, **kshared)  # noqa: E731
    t = interleaved_time_ms({"a": fa, "b": fb}, 0, args.repeats, args.calls_per_rep, before=sync_ranks, alternate=True)
    layer.raise_if_error()
    other.raise_if_error()
    a, b = max_over_ranks(t["a"]), max_over_ranks(t["b"])
    out = {"a_ms": a, "b_ms": b, "a_over_b": a / b, "b_rel_err_vs_reference": max_over_ranks(err)}
    if b_choice is not None:
        out["b_choice"] = b_choice
    if getattr(args, "ab_sustained", 0) > 0:
        out.update(ab_sustained_times({"a": fa, "b": fb}, args.ab_sustained))
        layer.raise_if_error()
        other.raise_if_error()
    return out


def ab_sustained_times(fns: dict, seconds: float) -> dict:
    """--ab-sustained: A and B each alone for about `seconds` after 0.5 s idle (gpu_state.sustained_ms, the same call
    count on every rank), in the order A, B, B, A, so that a steady drift cancels; each version's figure is the mean
    of its two windows, slowest rank."""
    ts = {"a": [], "b": []}
    for name in ("a", "b", "b", "a"):
        calls = sustained_calls(fns[name], seconds, agree=lambda n: int(max_over_ranks(n)))
        dist.barrier()
        t, _, _ = sustained_ms(fns[name], seconds, idle_s=0.5, calls=calls)
        ts[name].append(max_over_ranks(t))
    a, b = float(np.mean(ts["a"])), float(np.mean(ts["b"]))
    return {"a_sustained_ms": a, "b_sustained_ms": b, "a_over_b_sustained": a / b, "sustained_windows_ms": ts}
