"""Bad input to the simulator is a clear error naming the field and the value: never a hang, a crash or a silently
wrong answer (hardware profiles, policy specs, run sizes, trace generator parameters, placements)."""
import copy
import json
import re
import warnings

import numpy as np
import pytest

from weave_sim.cli import main
from weave_sim.costtable import DEFAULT_CHUNKS, build_table
from weave_sim.engine.plan import MAX_CHUNKS
from weave_sim.engine.policies import parse_policy
from weave_sim.placement import explicit
from weave_sim.presets import ModelPreset
from weave_sim.profile import PROFILE_DIR, ProfileError, fp8_profile, load_profile, profile_from_dict
from weave_sim.traces import sampling
from weave_sim.traces.generators import MAX_ROUTING_ENTRIES, generate
from weave_sim.workload import workload_from_counts

RAW = load_profile("h200").raw
TINY = "custom:E=8:k=2:H=256:I=256"


def _with(edit):
    raw = copy.deepcopy(RAW)
    edit(raw)
    return raw


def _set(path, value):
    def edit(raw):
        *outer, last = path.split(".")
        obj = raw
        for key in outer:
            obj = obj[key]
        obj[last] = value
    return edit


def _curve(path, value):
    def edit(raw):
        section, key = path.split(".")
        raw[section][key] = {x: value for x in raw[section][key]}
    return edit


def _drop(section, key):
    return lambda raw: raw[section].pop(key)


@pytest.mark.parametrize("edit, words", [
    (_set("nvlink.peak_gbs", -5), "nvlink.peak_gbs must be a finite number > 0, got -5"),  # simulate hung
    (_set("nvlink.peak_gbs", float("nan")), "nvlink.peak_gbs must be a finite number > 0, got nan"),
    (_set("gemm.peak_tflops", 0), "gemm.peak_tflops must be a finite number > 0, got 0"),  # printed 'inf us'
    (_set("hbm_gbs", 0), "hbm_gbs must be a finite number > 0, got 0"),
    (_set("hbm_gbs", float("nan")), "hbm_gbs must be a finite number > 0, got nan"),  # 'Negative delay'
    (_set("gemm.tile_rows", 0), "gemm.tile_rows must be an integer >= 1, got 0"),
    (_set("gemm.tile_cols", 64.5), "gemm.tile_cols must be an integer >= 1, got 64.5"),
    (_set("gemm.fp8_scale", -1), "gemm.fp8_scale must be a finite number > 0, got -1"),
    (_set("gemm.fp8_fixed_scale", float("inf")), "gemm.fp8_fixed_scale must be a finite number > 0"),
    (_curve("nvlink.push_gbs_by_ctas", 0), "nvlink.push_gbs_by_ctas: GB/s must be > 0 at every CTA count"),
    (_curve("gemm.per_sm_tflops_by_rows", 0), "gemm.per_sm_tflops_by_rows: TFLOP/s must be > 0 at every row count"),
    (_curve("gemm.per_sm_tflops_by_rows", float("nan")), "gemm.per_sm_tflops_by_rows: x must be > 0 and y >= 0"),
    (_curve("gemm.per_sm_tflops_by_rows", -1), "gemm.per_sm_tflops_by_rows: x must be > 0 and y >= 0"),
    (_set("nvlink", [1, 2]), "nvlink must be a JSON object, got list"),
    (_set("fixed_ns.launch", float("inf")), "fixed_ns.launch must be a finite number >= 0"),
    (_set("fixed_ns.signal", -1), "fixed_ns.signal must be a finite number >= 0"),
    (_drop("gemm", "peak_tflops"), "missing key 'gemm.peak_tflops'"),
    (_drop("nvlink", "push_gbs_by_ctas"), "missing key 'nvlink.push_gbs_by_ctas'"),
    (_set("chunk_eff", {"1": 1.0, "2": float("nan")}), "chunk_eff['2'] must be a finite number > 0"),
    (_set("chunk_eff", {"1": 1.0, "two": 0.9}), "chunk_eff: a chunk count K must be an integer >= 1, got 'two'"),
    (_set("rho", "high"), "rho must be a finite number >= 0 and <= 1, got 'high'"),
    (_set("num_sms", 131.5), "num_sms must be an integer >= 2, got 131.5"),
    (_set("power", {"cap_w": float("inf"), "base_w": 100, "w_per_tflops": 1, "exponent": 1}), "power.cap_w"),
])
def test_profile_fields_must_be_finite_and_in_range(edit, words):
    with pytest.raises(ProfileError, match=f"^test: .*{re.escape(words)}"):
        profile_from_dict(_with(edit), origin="test")


def test_every_shipped_profile_still_loads_with_its_fp8_form():
    names = sorted(p.stem for p in PROFILE_DIR.glob("*.json"))
    assert names
    for name in names:
        prof = load_profile(name)
        assert prof.gemm_peak_tflops > 0 and prof.hbm_gbs > 0 and prof.bw_gbs.min() > 0
        fp8_profile(prof)


def test_a_profile_without_a_default_chunk_count_says_what_to_add():
    """chunk_eff is a table (no interpolation; a calibration may measure only some K, the policies choose among
    those), so the cost model's default K set asks for one that is not there: the message names it and the fix."""
    prof = profile_from_dict(_with(_set("chunk_eff", {"1": 1.0, "4": 0.9})), origin="test")
    assert 2 in DEFAULT_CHUNKS
    with pytest.raises(ProfileError, match=r"no chunk efficiency for K=2 in its chunk_eff \(it gives K = 1, 4\).*"
                                           r"add chunk_eff\[\"2\"\] to the profile"):
        build_table(prof)


def test_profile_errors_reach_the_cli_as_one_line(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_with(_set("gemm.peak_tflops", 0))))  # (it printed 'inf us'; not -5 GB/s: that hung)
    argv = ["simulate", "--model", TINY, "--tokens", "64", "--gpus", "2", "--no-plots", "--quiet",
            "--profile", str(path), "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "gemm.peak_tflops must be a finite number > 0, got 0" in err and "Traceback" not in err


@pytest.mark.parametrize("k", ["100000000", "99999999999999999999", "0", str(MAX_CHUNKS + 1)])
def test_static_chunk_count_is_bounded(tmp_path, capsys, k):
    argv = ["simulate", "--model", TINY, "--tokens", "64", "--gpus", "2", "--no-plots", "--quiet", "--no-oracle",
            "--policy", f"static:20:{k}", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"K (combine chunks per GPU) must lie in [1, {MAX_CHUNKS}], got {k}" in err and "Traceback" not in err


def test_static_chunk_count_at_the_bound_runs(tmp_path):
    argv = ["simulate", "--model", TINY, "--tokens", "64", "--gpus", "2", "--no-plots", "--quiet", "--no-oracle",
            "--policy", f"static:20:{MAX_CHUNKS}", "--out", str(tmp_path)]
    assert main(argv) == 0


def test_too_many_gpus_for_the_pair_counts_is_an_error_before_allocating(tmp_path, capsys):
    argv = ["costmodel", "--model", "custom:E=8192:k=1:H=64:I=64", "--gpus", "1024", "--tokens", "1",
            "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--gpus 1024: 1024 x 1024 GPUs x 8192 experts x 1 layers is more pair counts than a run holds" in err
    assert "Traceback" not in err


def test_generate_bounds_the_routing_it_allocates(tmp_path, capsys):
    with pytest.raises(ValueError, match=f"100000000000 tokens x 2 layers x top-2 is more routing than a trace holds "
                                         f"\\({MAX_ROUTING_ENTRIES} entries\\)"):
        generate("zipf", num_experts=8, top_k=2, num_layers=2, num_tokens=10 ** 11, seed=0)
    argv = ["trace", "generate", "--kind", "zipf", "--model", TINY + ":layers=2", "--tokens", "100000000000",
            "-o", str(tmp_path / "x.npz")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "more routing than a trace holds" in err and "Traceback" not in err


@pytest.mark.parametrize("kind, params, words", [
    ("zipf", {"s": {"a": 1}}, "parameter s must be a finite number or a list of finite numbers, got {'a': 1}"),
    ("dirichlet", {"alpha": "many"}, "parameter alpha must be a finite number"),
    ("load_profile", {"counts": [1, 2, 3], "profile_layer_idx": [0, 1, 2, 3]},
     "parameter profile_layer_idx must give one model layer per row of counts (1), got [0, 1, 2, 3]"),
    ("load_profile", {"counts": [[1, 2, 3], [1, 1, 1]], "profile_num_layers": 1}, "parameter profile_num_layers"),
    ("load_profile", {"counts": [[[1]]]}, "parameter counts must be"),
    ("load_profile", {"domain": [1]}, "generator 'load_profile': a parameter has the wrong type"),
    ("fitted", {"source": {"a": 1}}, "parameter source must be a RoutingTrace or a trace path"),
    ("drifting", {"layer_shift_experts": [1, 2]}, "parameter layer_shift_experts must be one finite number"),
])
def test_bad_generator_parameter_values_are_clear_errors(kind, params, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        generate(kind, num_experts=8, top_k=2, num_layers=2, num_tokens=64, seed=0, **params)


def test_bad_generator_parameter_from_the_cli(tmp_path, capsys):
    argv = ["trace", "generate", "--kind", "zipf", "--model", TINY + ":layers=2", "--tokens", "100",
            "-o", str(tmp_path / "x.npz"), "-p", 's={"a":1}']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "parameter s must be" in err and "Traceback" not in err


@pytest.mark.parametrize("kind, param", [
    ("zipf", "imbalance"), ("zipf", "s"), ("dirichlet", "alpha"), ("fitted", "reuse"), ("fitted", "imbalance"),
    ("drifting", "drift_experts_per_1k_tokens"), ("drifting", "layer_shift_experts"),
])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_generator_parameters_are_rejected(kind, param, value):
    with pytest.raises(ValueError, match=f"parameter {param} must be .*finite"):
        generate(kind, num_experts=8, top_k=2, num_layers=2, num_tokens=64, seed=0, **{param: value})


def test_imbalance_target_nan_is_rejected_by_the_solver():
    with pytest.raises(ValueError, match=r"imbalance \(max/mean load\) must be in \[1, 4\)"):
        sampling.zipf_exponent_for_imbalance(8, 2, [2.0, float("nan")])


def test_a_huge_drift_rotates_without_overflowing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = generate("drifting", num_experts=8, top_k=2, num_layers=2, num_tokens=64, seed=0,
                         drift_experts_per_1k_tokens=1e300)
    ids = trace.topk_ids
    assert ids.min() >= 0 and ids.max() < 8 and np.all(ids[..., 0] != ids[..., 1])


def test_placement_of_the_wrong_length_is_a_clear_error():
    model = ModelPreset("m", 64, 64, 8, 2, 0, 1)
    pairs, rows = np.ones((2, 8), dtype=np.int64), np.ones((2, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="placement \\(explicit\\) has 6 expert owners, m has 8 experts"):
        workload_from_counts(pairs, rows, model, explicit([0, 0, 1, 1, 0, 1], 2), [4, 4])
    w = workload_from_counts(pairs, rows, model, explicit([0, 1] * 4, 2), [4, 4])
    assert w.pair_counts.sum() == 16


@pytest.mark.parametrize("spec", ["weave:", "static:", "oracle:", "kernel:", "kernel:weave:", "static:20:"])
def test_policy_with_an_empty_argument_is_rejected(spec):
    with pytest.raises(ValueError, match=f"policy {re.escape(repr(spec))}: empty argument after ':'"):
        parse_policy(spec)
    assert parse_policy("weave")[1] is None and parse_policy("oracle:fast")[1] == "fast"
