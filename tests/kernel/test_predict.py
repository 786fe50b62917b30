"""weave_kernel.predict: the simulator's expectations at world sizes not measured yet (CPU only)."""
from __future__ import annotations

import numpy as np
import pytest

from weave_kernel.predict import config_counts, geomean, main, predict_config
from weave_kernel.routing import bench_routing
from weave_sim.presets import get_model


def test_counts_are_the_benchmarks_routing():
    m = get_model("qwen3-30b-a3b")
    counts, ids, placement = config_counts(m, 4, 64, seed=3)
    want = [bench_routing(64, m.num_experts, m.top_k, seed=3, rank=r)[0] for r in range(4)]
    assert np.array_equal(ids, np.concatenate(want))
    assert counts["tokens_per_gpu"] == [64] * 4
    assert np.asarray(counts["source_expert_pairs"]).sum() == 4 * 64 * m.top_k
    assert placement.num_gpus == 4


@pytest.mark.parametrize("gpus", [2, 4])
def test_prediction_is_consistent(gpus):
    r = predict_config("qwen3-30b-a3b", gpus, 256, "h200-megakernel")
    ms = r["predicted_ms"]
    assert set(ms) >= {"sequential", "static:20", "weave"} and all(v > 0 for v in ms.values())
    statics = {p: v for p, v in ms.items() if p.startswith("static:")}
    assert ms[r["best_static"]] == min(statics.values())
    # the bound (seed h200 profile: peak rates) lies below every simulated schedule of the kernel
    assert 0 < r["bound_ms"] < min(ms.values())
    assert r["weave_vs_static20"] == pytest.approx(ms["static:20"] / ms["weave"])
    assert r["weave_fraction_of_bound"] == pytest.approx(r["bound_ms"] / ms["weave"])
    assert r["regret"] is None and r["best_weave"] is None


def test_regret_against_a_weave_sweep():
    r = predict_config("qwen3-30b-a3b", 2, 256, "h200-megakernel", weave_grid=(4, 16))
    ms = r["predicted_ms"]
    assert r["best_weave"] == min(("weave:4", "weave:16"), key=ms.get)
    assert r["regret"] == pytest.approx(ms["weave"] / ms[r["best_weave"]] - 1)


def test_weave_without_stealing():
    r = predict_config("qwen3-30b-a3b", 2, 256, "h200-megakernel", nosteal=True)
    ms = r["predicted_ms"]
    assert r["weave_vs_nosteal"] == pytest.approx(ms["weave-nosteal"] / ms["weave"])
    assert "weave-nosteal" not in predict_config("qwen3-30b-a3b", 2, 256, "h200-megakernel")["predicted_ms"]


def test_faster_tiles_predict_a_faster_layer():
    base = predict_config("qwen3-30b-a3b", 2, 256, "h200-megakernel")
    fast = predict_config("qwen3-30b-a3b", 2, 256, "h200-megakernel", gemm_scale=1.2)
    assert fast["gemm_scale"] == 1.2 and fast["bound_ms"] == base["bound_ms"]
    assert fast["predicted_ms"]["sequential"] < base["predicted_ms"]["sequential"]


def test_geomean_and_cli_errors(capsys):
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([None, 3.0]) == pytest.approx(3.0)
    with pytest.raises(SystemExit):
        main(["--gpus", "3", "--models", "qwen3-30b-a3b"])  # 128 experts do not split over 3 GPUs
    assert "multiple of the world size 3" in capsys.readouterr().err
    for argv, words in [(["--gpus", "0"], "world size 0"), (["--gpus", "2,16"], "world size 16"),
                        (["--tokens", "0"], "--tokens must be >= 1"),
                        (["--models", "custom:E=64:k=4:H=100:I=64", "--gpus", "2"], "multiples of 64"),
                        (["--models", "qwen3-30b-a3b", "--routing-trace", "default"], "model mismatch"),
                        (["--gpus", "x"], "--gpus must be comma-separated integers, got 'x'"),
                        (["--tokens", "12a"], "--tokens must be comma-separated integers"),
                        (["--weave-grid", "8,a"], "--weave-grid must be comma-separated integers"),
                        (["--weave-grid", "0,8"], "--weave-grid values must lie in [1, 131]"),
                        (["--synthetic", "zipf", "--layers", "x"], "comma-separated MoE layer numbers")]:
        with pytest.raises(SystemExit):  # a usage error before any worker starts, not a worker's traceback
            main(argv)
        assert words in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        main(["--gemm-scale", "0"])


def test_per_layer_routing_is_the_benchmarks(capsys, tmp_path):
    from weave_kernel.routing import RoutingSpec, rank_routing

    m = get_model("deepseek-v2-lite")
    spec = RoutingSpec("synthetic", kind="fitted")
    _, ids, _ = config_counts(m, 2, 64, seed=1, spec=spec, layer=5)
    assert np.array_equal(ids, np.concatenate([rank_routing(spec, m, 2, 64, seed=1, rank=r, layer=5)[0]
                                               for r in range(2)]))
    out = tmp_path / "p.json"
    assert main(["--gpus", "2", "--models", m.name, "--tokens", "128", "--synthetic", "fitted", "--layers", "0,25",
                 "--jobs", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "deepseek-v2-lite@L0" in text and "deepseek-v2-lite@L25" in text and "synthetic fitted" in text
    import json

    doc = json.loads(out.read_text())
    assert [r["layer"] for r in doc["rows"]] == [0, 25] and doc["routing"]["kind"] == "fitted"
    with pytest.raises(SystemExit):
        main(["--models", m.name, "--layers", "26", "--synthetic", "fitted"])
    assert "MoE layers lie in" in capsys.readouterr().err


def test_balanced_placement_evens_the_gpus():
    """predict --placement balanced: the same routing, the experts re-placed from this layer's loads; every GPU keeps
    E/G experts and the busiest GPU's pairs come closer to the mean than under the benchmark's contiguous map."""
    from weave_kernel.routing import RoutingSpec

    m, spec = get_model("phi-3.5-moe"), RoutingSpec("synthetic", kind="fitted")
    imbalance = {}
    for kind in ("contiguous", "balanced"):
        counts, ids, pl = config_counts(m, 2, 1024, seed=2, spec=spec, layer=0, placement=kind)
        assert np.bincount(pl.owner, minlength=2).tolist() == [8, 8]
        per_gpu = np.bincount(pl.owner[ids.ravel()], minlength=2)
        assert np.asarray(counts["source_expert_pairs"]).sum() == ids.size
        imbalance[kind] = per_gpu.max() / per_gpu.mean()
    assert imbalance["balanced"] < imbalance["contiguous"]
    row = predict_config(m.name, 2, 1024, "h200-megakernel", seed=2, spec=spec, layer=0, static_grid=(8, 20),
                         placement="balanced")
    assert row["placement"] == "balanced" and row["predicted_ms"]["weave"] > 0
    with pytest.raises(ValueError, match="contiguous or balanced"):
        config_counts(m, 2, 64, placement="round-robin")


def test_shared_experts_are_simulated_and_bounded(capsys, tmp_path):
    """--shared first|last: a model's fused shared expert costs time and joins the bound (bound_volumes); the row
    and the JSON record it, the header says it; a model without shared experts runs as under off."""
    import json

    m = "deepseek-v2-lite"  # 2 shared experts of I = 1408
    off = predict_config(m, 2, 512, "h200-megakernel-ep2", static_grid=(20,))
    on = {o: predict_config(m, 2, 512, "h200-megakernel-ep2", static_grid=(20,), shared=o) for o in ("first", "last")}
    assert off["shared"] == "off" and off["inter_shared"] == 0
    for o, r in on.items():
        assert r["shared"] == o and r["inter_shared"] == 2 * 1408
        assert r["bound_ms"] > off["bound_ms"]
        assert 0 < r["bound_ms"] < min(r["predicted_ms"].values())
        for p, t in r["predicted_ms"].items():
            assert t > off["predicted_ms"][p], (o, p)
    none = predict_config("qwen3-30b-a3b", 2, 256, "h200-megakernel", static_grid=(20,), shared="last")
    assert none["shared"] == "off" and none == {**predict_config("qwen3-30b-a3b", 2, 256, "h200-megakernel",
                                                                 static_grid=(20,)), "shared": "off"}
    with pytest.raises(ValueError, match="shared must be one of"):
        predict_config(m, 2, 64, "h200-megakernel", shared="both")
    out = tmp_path / "p.json"
    assert main(["--gpus", "2", "--models", f"{m},qwen3-30b-a3b", "--tokens", "256", "--jobs", "1", "--shared", "last",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "shared experts last" in text and "none in qwen3-30b-a3b" in text
    doc = json.loads(out.read_text())
    assert doc["shared"] == "last" and [r["shared"] for r in doc["rows"]] == ["last", "off"]
    assert main(["--gpus", "2", "--models", "qwen3-30b-a3b", "--tokens", "64", "--jobs", "1"]) == 0
    assert "shared experts off" in capsys.readouterr().out
    wide = "custom:E=64:k=4:H=128:I=4096:shared=64"  # a shared FFN 262144 wide: past the kernel's limit when fused
    with pytest.raises(SystemExit):
        main(["--gpus", "2", "--models", wide, "--tokens", "64", "--shared", "first"])
    assert "the shared expert's width (262144)" in capsys.readouterr().err


def test_fp8_experts_are_predicted_faster_with_the_same_bound():
    base = predict_config("deepseek-v2-lite", 2, 512, "h200-megakernel-ep2", static_grid=(20,))
    f8 = predict_config("deepseek-v2-lite", 2, 512, "h200-megakernel-ep2", static_grid=(20,), fp8=1.5)
    assert f8["fp8"] == 1.5 and base["fp8"] == 0.0
    assert f8["bound_ms"] == base["bound_ms"]  # the bf16 layer's bound, on both
    for pol in ("sequential", "static:20", "weave"):
        assert f8["predicted_ms"][pol] < base["predicted_ms"][pol], pol
