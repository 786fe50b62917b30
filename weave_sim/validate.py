"""Simulator versus measured kernel: predicted and measured latency per configuration and policy.

Input: the JSON of `python -m weave_kernel.bench` (run on the GPU machine). Each result must carry the
counts the kernel exchanged (`counts`: `source_expert_pairs` [G, E], `dispatch_rows` [G, G],
`tokens_per_gpu` [G]) and `latency_ms` per policy; the simulator rebuilds the same layer from the counts
and simulates each measured policy. Reported per configuration: prediction error per policy, the regret
of the simulator's best static split against the measured best (measured time of the simulator's pick over
the measured best), and the gain of `weave` over the best static split, predicted and measured.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .benchfile import bench_kernel_sources, check_bench, read_bench, result_name
from .placement import Placement, contiguous, explicit
from .presets import ModelPreset, get_model
from .profile import HardwareProfile, profile_from_dict
from .workload import workload_from_counts

def sim_policy(kernel_policy: str, result: dict | None = None) -> str:
    """The engine's model of the megakernel under `kernel_policy` (engine/policies/kernel.py). For `weave` and
    `weave-nosteal`, the comm CTA counts the kernel recorded per rank in its `weave` call (the same counts and
    table choose the same split; so a profile other than the kernel's own still simulates the split that ran)."""
    used = ((result or {}).get("weave_choice") or {}).get("kernel")
    if kernel_policy in ("weave", "weave-nosteal") and used and all(used):
        return f"kernel:{kernel_policy}@" + ",".join(str(int(u["comm_ctas_used"])) for u in used)
    return f"kernel:{kernel_policy}"


def config_label(model: str, layer: int | None) -> str:
    """A configuration's name in tables: the model, with "@L<layer>" when the benchmark's routing was per layer."""
    return model + ("" if layer is None else f"@L{layer}")


@dataclass
class ConfigValidation:
    model: str
    tokens_per_gpu: int
    gpus: int
    measured_ms: dict
    predicted_ms: dict
    regret_static: float | None = None
    regret_weave: float | None = None  # measured weave over the best measured weave:C (the kernel's own choice)
    gain_predicted: float | None = None
    gain_measured: float | None = None
    predicted_mhz: dict = field(default_factory=dict)  # policy -> SM clock per GPU (profiles with a power model)
    measured_mhz: list | None = None  # per rank, the configuration's median SM clock (bench's gpu_state)
    notes: list = field(default_factory=list)
    traces: list = field(default_factory=list)
    layer: int | None = None  # the MoE layer whose routing ran (benchmarks with per-layer routing)

    @property
    def label(self) -> str:
        """The model, with the MoE layer when the benchmark's routing was per layer."""
        return config_label(self.model, self.layer)

    def errors(self) -> dict:
        return {p: (self.predicted_ms[p] - self.measured_ms[p]) / self.measured_ms[p] for p in self.predicted_ms}

    def to_dict(self) -> dict:
        return {**self.__dict__, "relative_error": self.errors()}


def result_placement(r: dict) -> Placement:
    """The expert -> rank map a benchmark result ran with: its recorded owners (bench --placement), else the
    benchmark's contiguous map."""
    if r.get("placement_owner") is not None:
        return explicit(r["placement_owner"], int(r["gpus"]))
    return contiguous(int(r["experts"]), int(r["gpus"]))


def result_shared(r: dict) -> str:
    """Where a benchmark result's kernel computed the fused shared expert: its "shared" ('off', 'first' or 'last':
    its tiles before or after every routed tile in the tile queue); results without it ran none ('off')."""
    from .engine.dag import SHARED_ORDERS

    shared = r.get("shared", "off")
    if shared not in SHARED_ORDERS:
        raise ValueError(f"result {r.get('model')}/{r.get('tokens_per_gpu')}: unknown shared {shared!r} "
                         f"(known: {', '.join(SHARED_ORDERS)})")
    return shared


def result_shared_experts(r: dict) -> int:
    """Shared experts of the layer a result ran (the fused FFN is this many x I wide): 0 unless result_shared is
    'first' or 'last'; then its "inter_shared" (the FFN's width, as bench records it) / "inter", else its
    "shared_experts", else the count of the preset (or spec) its "model" names."""
    if result_shared(r) == "off":
        return 0
    if r.get("inter_shared") is not None:
        width, inter = int(r["inter_shared"]), int(r["inter"])
        if width % inter:
            raise ValueError(f"result {r.get('model')}/{r.get('tokens_per_gpu')}: inter_shared {width} is not a "
                             f"multiple of inter {inter} (the engine's shared FFN is shared experts x I wide)")
        return width // inter
    if r.get("shared_experts") is not None:
        return int(r["shared_experts"])
    try:
        return get_model(r["model"]).num_shared_experts
    except (KeyError, ValueError):
        raise ValueError(f"result {r.get('model')}/{r.get('tokens_per_gpu')} ran shared {r['shared']!r} but names "
                         f"neither 'inter_shared', 'shared_experts' nor a known model") from None


def _layer_from_result(r: dict):
    model = ModelPreset(r["model"], int(r["hidden"]), int(r["inter"]), int(r["experts"]), int(r["top_k"]),
                        result_shared_experts(r), 1)
    placement = result_placement(r)
    c = r.get("counts")
    if c is None:
        raise ValueError(f"result {r['model']}/{r['tokens_per_gpu']} has no 'counts': re-run the kernel benchmark")
    try:
        return workload_from_counts(c["source_expert_pairs"], c["dispatch_rows"], model, placement,
                                    c["tokens_per_gpu"])
    except ValueError as exc:  # shapes that do not fit the layer, inconsistent or non-integer counts
        raise ValueError(f"{result_name(r)}: {exc}") from None


def profile_for_result(r: dict, profile: HardwareProfile) -> HardwareProfile:
    """`profile` with as many SMs as the benchmark's grid had CTAs (`bench --num-ctas`, recorded as "num_ctas"),
    else `profile` itself: a kernel launched on fewer CTAs than SMs is simulated on that many SMs. A result of FP8
    experts gets the profile's FP8 tiles (profile.fp8_profile: the profile's gemm.fp8_scale, else FP8_TILE_SCALE)."""
    if result_fp8(r):
        from .profile import fp8_profile

        profile = fp8_profile(profile)
    n = r.get("num_ctas")
    if n is None or int(n) == profile.num_sms:
        return profile
    if not 1 < int(n) <= profile.num_sms:
        raise ValueError(f"result {r.get('model')}/{r.get('tokens_per_gpu')}: num_ctas {n} is not in "
                         f"[2, {profile.num_sms}] (the profile's SMs)")
    raw = json.loads(json.dumps(profile.to_dict()))
    raw["num_sms"] = int(n)
    return profile_from_dict(raw, origin=f"{profile.name} on {int(n)} SMs")


def validate_result(r: dict, profile: HardwareProfile, seed: int = 0, trace_dir: Path | None = None) -> ConfigValidation:
    """Simulate every measured kernel policy of one benchmark result (on the grid it ran on). With `trace_dir`,
    also write the simulated Chrome trace of each policy whose name is in TRACE_POLICIES, to open beside the
    kernel's."""
    from .engine import simulate_layer, write_chrome_trace

    profile = profile_for_result(r, profile)
    w = _layer_from_result(r)
    measured = {p: float(t) for p, t in r["latency_ms"].items() if p != "reference"}
    out = ConfigValidation(r["model"], int(r["tokens_per_gpu"]), int(r["gpus"]), measured, {},
                           layer=None if r.get("layer") is None else int(r["layer"]))
    state = r.get("gpu_state")
    if isinstance(state, list) and all(isinstance(g, dict) for g in state):
        out.measured_mhz = [g.get("sm_mhz_median") for g in state]
    for pol in measured:
        keep = trace_dir is not None and pol in TRACE_POLICIES
        try:
            res = simulate_layer(w, profile, sim_policy(pol, r), seed=seed, record_timeline=keep,
                                **kernel_options(r))
        except ValueError as exc:
            out.notes.append(f"{pol}: not simulated ({exc})")
            continue
        out.predicted_ms[pol] = res.latency_ns / 1e6
        if res.gemm_clock is not None:
            mhz = float((profile.raw.get("power") or {}).get("clock_mhz", 1980.0))
            out.predicted_mhz[pol] = [round(float(c) * mhz, 1) for c in res.gemm_clock]
        if keep:
            name = f"sim_{out.label.replace('@', '_')}_{r['tokens_per_gpu']}_{pol.replace(':', '-')}.json"
            out.traces.append(str(write_chrome_trace(res, Path(trace_dir) / name)))
    statics = sorted((p for p in out.predicted_ms if p.startswith("static:")), key=lambda p: int(p.split(":")[1]))
    if statics:
        sim_pick = min(statics, key=out.predicted_ms.get)
        best_measured = min(measured[p] for p in statics)
        out.regret_static = measured[sim_pick] / best_measured - 1.0
        sweep = [measured[p] for p in measured if p.startswith("weave:")]
        if "weave" in measured and sweep:
            out.regret_weave = measured["weave"] / min(sweep) - 1.0
        if "weave" in out.predicted_ms:
            out.gain_predicted = min(out.predicted_ms[p] for p in statics) / out.predicted_ms["weave"]
            out.gain_measured = best_measured / measured["weave"]
    return out


TRACE_POLICIES = ("weave",)
# How the megakernel lays out the rows it computes, as engine options. Both send rows expert by expert (the
# engine's 'expert' dispatch order, engine/dag.py "Row layout"). "segment-padded" (the first kernel, the runs
# in docs/results/kernel_bench_2xh200_static.json and kernel_bench_weave.json): every (expert, source) segment
# padded to whole 128-row blocks, and an all-padding 64-row warpgroup skipped its MMAs, so padding cost up to
# 64 rows. "expert-packed" (the kernel now): an expert's rows from all sources back to back, padded once to a
# whole block, and every tile computes all 128 rows; its dispatch is modelled transfer by transfer as the kernel
# sends it (the 'piece' order: one transfer per (source, expert, owner row block); since 2026-12-01, before
# that 'expert' with 128-row transfers cut across experts). A benchmark result names its layout in
# "kernel_layout"; results without it come from the first kernel. "expert-packed-half" (since sources
# eb48d782, 2026-12-03): the same, but a block of at most 64 rows runs as a half tile (csrc/wgmma.cuh
# mma_stage_half), so its MMAs cost 64 rows; bf16 layers without the fused shared expert only until FP8 tiles got
# them too (mma_stage_half_e4m3, 2026-12-03), and since the fifth session of 2026-12-03 the bf16 instance with the
# shared expert's code as well (csrc/pipeline.cuh's idle form: the warpgroup of the padding rows issues no MMAs);
# the FP8 instance with it computes every block in full (kernel_layout_for). Results measured before each change
# carry "expert-packed", as bench recorded it then.
KERNEL_LAYOUTS = {
    "segment-padded": {"dispatch_order": "expert", "segment_pad_rows": 64},
    "expert-packed": {"dispatch_order": "piece", "expert_pad_rows": 128},
    "expert-packed-half": {"dispatch_order": "piece", "expert_pad_rows": 64},
}
KERNEL_LAYOUT = "expert-packed-half"  # this kernel's, for layers without a fused shared expert
KERNEL_OPTIONS = KERNEL_LAYOUTS[KERNEL_LAYOUT]


def kernel_layout_for(expert_dtype: str = "bf16", shared: bool = False) -> str:
    """The layout this kernel computes a layer in: half tiles in its instances without the shared expert's code,
    bf16 and FP8 (csrc/tasks.cuh MoeTiles::kHalf), and in the bf16 instance with it (kIdleHalf); "expert-packed" in
    the FP8 instance with it."""
    if expert_dtype not in ("bf16", "fp8"):
        raise ValueError(f"expert_dtype must be 'bf16' or 'fp8', got {expert_dtype!r}")
    return "expert-packed" if shared and expert_dtype == "fp8" else KERNEL_LAYOUT


# Which CTAs make weave's in-kernel choice (engine option kernel_deciders). "table" (the kernel now, since
# 9caebac): those below the cost table's max_comm_sms under weave, CTA 0 under weave:C; "all" (every kernel
# before it): every CTA, and all of them wait for it. A benchmark result names it in "kernel_deciders"; results
# without it are "all", except those of the two kernel source versions measured after the change and before
# bench recorded it (the benchmark file's kernel_sources).
KERNEL_DECIDERS = "table"  # this kernel's (bench records it); the modes: engine.run.DECIDER_MODES
TABLE_DECIDER_SOURCES = frozenset({"sha256:a316c1b34f92143f", "sha256:0ecf088e94391481"})


def kernel_options(r: dict) -> dict:
    """Engine options that model the kernel a benchmark result was measured on (results read through
    bench_results name their deciders; a result that ran the fused shared expert adds its position, `shared`)."""
    layout = r.get("kernel_layout", "segment-padded")
    if layout not in KERNEL_LAYOUTS:
        raise ValueError(f"unknown kernel_layout {layout!r} (known: {sorted(KERNEL_LAYOUTS)})")
    from .engine.run import DECIDER_MODES

    deciders = r.get("kernel_deciders", "all")
    if deciders not in DECIDER_MODES:
        raise ValueError(f"unknown kernel_deciders {deciders!r} (known: {', '.join(DECIDER_MODES)})")
    shared = result_shared(r)
    return {**KERNEL_LAYOUTS[layout], "kernel_deciders": deciders, **({"shared": shared} if shared != "off" else {}),
            **({"expert_dtype": "fp8"} if result_fp8(r) else {})}


def result_fp8(r: dict) -> bool:
    """Whether a benchmark result ran FP8 experts (bench --expert-dtype fp8 records "expert_dtype")."""
    from .workload import EXPERT_DTYPES

    dtype = r.get("expert_dtype", "bf16")
    if dtype not in EXPERT_DTYPES:
        raise ValueError(f"result {r.get('model')}/{r.get('tokens_per_gpu')}: unknown expert_dtype {dtype!r}")
    return dtype == "fp8"


def bench_results(data: dict, path="the benchmark", error: type[Exception] = ValueError) -> list[dict]:
    """The results of a loaded benchmark file, the types of their fields checked (check_result with require=False:
    `error` naming `path`, the result and the field; read_bench also requires the fields), each naming its kernel's
    deciders ("kernel_deciders"; for results that do not, dated by the file's kernel_sources: see
    TABLE_DECIDER_SOURCES)."""
    results = check_bench(data, path, error, require=False)
    dated = "table" if bench_kernel_sources(data) in TABLE_DECIDER_SOURCES else "all"
    return [r if "kernel_deciders" in r else {**r, "kernel_deciders": dated} for r in results]


def kernel_sources_warning(bench: dict, profile: HardwareProfile) -> str | None:
    """A warning when `profile` was fitted to latencies of other kernel sources than the ones `bench` measured
    (both fingerprints recorded: weave_kernel.build.sources_digest); None when they agree or one is unknown."""
    fitted = (profile.raw.get("calibration") or {}).get("kernel_sources")
    measured = bench_kernel_sources(bench)
    if not fitted or not measured or fitted == measured:
        return None
    return (f"profile {profile.name} was fitted to kernel sources {fitted}, these results measured {measured}: "
            f"its fitted factors describe the other kernel (refit with weave-sim calibrate --fit on a run of this one)")


def dispatch_warning(bench: dict, profile: HardwareProfile) -> str | None:
    """A warning when the benchmark's comm CTAs copied their rows another way (bench --dispatch, recorded in its
    config) than the push curve of `profile` was measured with (calibrate --dispatch, recorded as nvlink.dispatch;
    absent = the default all-thread copy); None when they agree."""
    measured = str((bench.get("config") or {}).get("dispatch", "threads"))
    curve = str(profile.raw.get("nvlink", {}).get("dispatch", "threads"))
    if measured.split(":")[0] == curve.split(":")[0]:
        return None
    return (f"these results dispatched rows by {measured!r}, profile {profile.name}'s push curve describes "
            f"{curve!r} copies (calibrate --dispatch {measured}, then weave-sim calibrate on those measurements)")


def validate_file(path, profile: HardwareProfile, seed: int = 0, trace_dir: Path | None = None,
                  workers: int = 1, data: dict | None = None) -> list[ConfigValidation]:
    """validate_result for every result of a benchmark file, in its order; workers > 1 simulates the results in
    that many processes (the same rows: each simulation is a pure function of its inputs). `data`: the file as
    read_bench already read it (so a caller that needs it too reads it once)."""
    if data is None:
        data = read_bench(path)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    results = bench_results(data)
    if workers == 1 or len(results) == 1:
        return [validate_result(r, profile, seed, trace_dir) for r in results]
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    one = partial(validate_result, profile=profile, seed=seed, trace_dir=trace_dir)
    with ProcessPoolExecutor(max_workers=min(workers, len(results))) as pool:
        return list(pool.map(one, results))


FIDELITY_LIMIT = 0.15  # issue 5's worst-case |predicted - measured| / measured


def summarize(rows: list[ConfigValidation]) -> dict:
    errs = np.array([abs(e) for r in rows for e in r.errors().values()])
    regrets = np.array([r.regret_static for r in rows if r.regret_static is not None])
    weave_regrets = np.array([r.regret_weave for r in rows if r.regret_weave is not None])
    return {
        "configs": len(rows),
        "median_abs_error": float(np.median(errs)) if errs.size else None,
        "worst_abs_error": float(errs.max()) if errs.size else None,
        "median_regret_static": float(np.median(regrets)) if regrets.size else None,
        "median_regret_kernel_choice": float(np.median(weave_regrets)) if weave_regrets.size else None,
        "points": int(errs.size),
        "points_over_15pct": int((errs > FIDELITY_LIMIT).sum()),
    }


def errors_by_policy(rows: list[ConfigValidation]) -> dict[str, dict]:
    """Per kernel policy over all configurations: points, median and worst |error|, median signed error
    (+ = predicted slower than measured) and the points over FIDELITY_LIMIT, in the order policies first appear."""
    by: dict[str, list[float]] = {}
    for r in rows:
        for pol, e in r.errors().items():
            by.setdefault(pol, []).append(e)
    out = {}
    for pol, v in by.items():
        a = np.abs(v)
        out[pol] = {"points": len(v), "median_abs_error": float(np.median(a)), "worst_abs_error": float(a.max()),
                    "median_error": float(np.median(v)), "points_over_15pct": int((a > FIDELITY_LIMIT).sum())}
    return out
