"""A kernel benchmark file (python -m weave_kernel.bench) as the simulator reads it: each result checked to be usable
(check_result: the fields' types, finite latencies > 0), the file read and checked (read_bench), and the times that
stand for its latencies (timed_as: bench-style or sustained, with the clocks each policy held)."""
from __future__ import annotations

import numpy as np

from .jsonfile import is_number, read_json


#: Integer fields every benchmark result needs (the layer the simulator rebuilds), each >= 1.
RESULT_INTS = ("tokens_per_gpu", "gpus", "experts", "top_k", "hidden", "inter")
#: The arrays of a result's "counts" (workload_from_counts checks their shapes).
COUNT_KEYS = ("source_expert_pairs", "dispatch_rows", "tokens_per_gpu")


def _is_int(v) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


def _is_time(v) -> bool:
    """A usable measured time in ms: a finite number > 0."""
    return is_number(v) and v > 0


def bench_kernel_sources(bench: dict) -> str | None:
    """The fingerprint of the kernel a benchmark file measured (its "kernel_sources" "main" entry), or None."""
    ks = bench.get("kernel_sources")
    return ks.get("main") if isinstance(ks, dict) else None


def result_name(r: dict, i: int | None = None) -> str:
    """A benchmark result in messages: "result 3 (qwen3-30b-a3b/2048)" (its position, model and tokens per GPU)."""
    what = "/".join(str(r.get(k, "?")) for k in ("model", "tokens_per_gpu")) if isinstance(r, dict) else "?"
    return f"result {'' if i is None else f'{i} '}({what})"


def check_result(r, where: str, i: int | None = None, error: type[Exception] = ValueError,
                 require: bool = True) -> dict:
    """`r` if it is a benchmark result the simulator can read, else `error` naming `where` (the file), the result and
    the field: an object with "model" (a string), the RESULT_INTS (integers >= 1), "latency_ms" (an object of
    policy -> finite time > 0), and where present and not null: "counts" (an object of the COUNT_KEYS' arrays),
    "layer" and "num_ctas" (integers), "placement_owner" (a list), "weave_choice" (an object whose "kernel" is a list
    of objects or nulls, each with an integer "comm_ctas_used"). require=False: the fields' types only where they
    are present (a result assembled in code may carry only what its caller reads)."""
    if not isinstance(r, dict):
        raise error(f"{where}: result {'' if i is None else f'{i} '}is {str(r)[:80]}, not an object")
    name = f"{where}: {result_name(r, i)}"
    if "model" not in r:
        if require:
            raise error(f"{name}: has no 'model'")
    elif not isinstance(r["model"], str):
        raise error(f"{name}: model {r['model']!r} is not a string")
    for key in RESULT_INTS:
        if key not in r:
            if require:
                raise error(f"{name}: has no {key!r}")
        elif not (_is_int(r[key]) and r[key] >= 1):
            raise error(f"{name}: {key} {r[key]!r} is not an integer >= 1")
    if "latency_ms" not in r:
        if require:
            raise error(f"{name}: has no 'latency_ms'")
    else:
        lat = r["latency_ms"]
        if not isinstance(lat, dict):
            raise error(f"{name}: latency_ms must be an object of policy -> time in ms, got {str(lat)[:80]}")
        for pol, t in lat.items():
            if not _is_time(t):
                raise error(f"{name}: latency_ms[{pol!r}] is {t!r}, not a finite time > 0 ms")
    c = r.get("counts")
    if c is not None:
        if not isinstance(c, dict):
            raise error(f"{name}: counts must be an object with {', '.join(COUNT_KEYS)}, got {str(c)[:80]}")
        for key in COUNT_KEYS:
            if not isinstance(c.get(key), list):
                raise error(f"{name}: counts[{key!r}] must be an array, got {str(c.get(key))[:80]}")
    for key in ("layer", "num_ctas"):
        if r.get(key) is not None and not _is_int(r[key]):
            raise error(f"{name}: {key} {r[key]!r} is not an integer")
    if r.get("placement_owner") is not None and not isinstance(r["placement_owner"], list):
        raise error(f"{name}: placement_owner must be an array of owner ranks, got {str(r['placement_owner'])[:80]}")
    choice = r.get("weave_choice")
    if choice is not None:
        kernel = choice.get("kernel") if isinstance(choice, dict) else None
        if not isinstance(choice, dict) or not (kernel is None or (isinstance(kernel, list) and all(
                u is None or (isinstance(u, dict) and _is_int(u.get("comm_ctas_used"))) for u in kernel))):
            raise error(f"{name}: weave_choice must be an object whose 'kernel' lists each rank's "
                        f"{{'comm_ctas_used': C}} (or null), got {str(choice)[:120]}")
    return r


def _results_list(data, path, error: type[Exception] = ValueError) -> list:
    """data["results"] of a loaded benchmark file ([] if it has none); `error` naming `path` when the file is not an
    object or its results not a list of objects."""
    if not isinstance(data, dict):
        raise error(f"{path}: a kernel benchmark file must be a JSON object with 'results', got "
                    f"{type(data).__name__}")
    results = data.get("results")
    if results is None:
        return []
    if not isinstance(results, list):
        raise error(f"{path}: 'results' must be a list of benchmark results, got {str(results)[:80]}")
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise error(f"{path}: result {i} is {str(r)[:80]}, not an object")
    return results


def check_bench(data, path="the benchmark", error: type[Exception] = ValueError, require: bool = True) -> list[dict]:
    """The results of a loaded benchmark file, each checked by check_result; `error` naming `path` when the file is
    not an object with a 'results' list."""
    return [check_result(r, str(path), i, error, require) for i, r in enumerate(_results_list(data, path, error))]


TIMINGS = ("bench", "sustained")  # which of a result's times stand for its latency (timed_as)


def read_bench(path, timing: str = "bench", error: type[Exception] = ValueError) -> dict:
    """A kernel benchmark file (python -m weave_kernel.bench), checked to hold results with latencies, each result
    readable (check_result, on the times `timing` picks); `error` naming the file (and the result and field)
    otherwise. timing 'sustained': as timed_as gives it."""
    data = read_json(path, "kernel benchmark results", error)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or not all(isinstance(r, dict) and "latency_ms" in r for r in results):
        raise error(f"{path} is not a kernel benchmark file (python -m weave_kernel.bench writes one: "
                    f"'results', each with 'latency_ms')")
    if not results:
        raise error(f"{path}: no 'results' in the kernel benchmark file")
    data = timed_as(data, timing, path)
    check_bench(data, path, error)
    return data


def timed_as(data: dict, timing: str, path="the benchmark") -> dict:
    """The benchmark with the times `timing` names as its latencies. 'bench': as it is (latency_ms: each call timed
    alone, interleaved with the other policies and the reference, so the board sits near its burst clock).
    'sustained': every result's sustained_ms (bench --sustained S: each policy back to back for S seconds, the clock
    a stream of layers holds at the power cap; docs/power.md) as its latency_ms, and the clock of those passes as
    its gpu_state; a ValueError when a result has none. The profiles with a power model predict a sustained clock,
    and were fitted to bench timings (docs/kernel.md, "The FP8 tile factor, measured in one harness")."""
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
    if timing == "bench":
        return data
    out = []
    for i, r in enumerate(_results_list(data, path)):
        if not r.get("sustained_ms"):
            raise ValueError(f"{path}: result {r.get('model')}/{r.get('tokens_per_gpu')} has no sustained_ms "
                             "(benchmark with bench --sustained S to validate sustained timings)")
        if not isinstance(r["sustained_ms"], dict):
            raise ValueError(f"{path}: {result_name(r, i)}: sustained_ms must be an object of policy -> time in ms, "
                             f"got {str(r['sustained_ms'])[:80]}")
        passes = [p for runs in _sustained_states(r).values() for p in _passes(runs)]  # [pass][rank]
        state = [None if m is None else {"sm_mhz_median": m} for m in _rank_clocks(passes, np.median)]
        out.append({**r, "latency_ms": dict(r["sustained_ms"]), "gpu_state": state or None, "timing": "sustained",
                    "policy_mhz": policy_clocks(r)})
    return {**data, "results": out}


def policy_clocks(r: dict) -> dict:
    """{policy: [per rank, the mean over its sustained passes of the median SM clock]} of one benchmark result
    (bench --sustained records each policy's passes apart; calibrate fits power_scale to these), None for a rank
    without samples."""
    return {pol: _rank_clocks(_passes(runs), np.mean) for pol, runs in _sustained_states(r).items()}


def _sustained_states(r: dict) -> dict:
    """A result's sustained_gpu_state ({policy: its passes' gpu_state}), {} when it has none (or not an object)."""
    states = r.get("sustained_gpu_state")
    return states if isinstance(states, dict) else {}


def _passes(runs) -> list:
    """One policy's sustained gpu_state as [pass][rank] summaries: bench records a list of passes, each a list of
    the ranks'; files written before it kept the passes apart (docs/results/power/bench_sustained_1gpu.json) hold one
    summary per rank, taken here as one pass."""
    if not isinstance(runs, list):
        return []
    if runs and all(p is None or isinstance(p, dict) for p in runs):
        return [runs]
    return [p for p in runs if isinstance(p, list)]


def _rank_clocks(passes: list, reduce) -> list:
    """Per rank, `reduce` over the passes ([pass][rank] gpu_state summaries) of their median SM clock; None for a rank
    without samples."""
    out = []
    for g in range(max((len(p) for p in passes), default=0)):
        mhz = [p[g]["sm_mhz_median"] for p in passes
               if g < len(p) and isinstance(p[g], dict) and _is_time(p[g].get("sm_mhz_median"))]
        out.append(float(reduce(mhz)) if mhz else None)
    return out
