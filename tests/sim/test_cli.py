"""The CLI end to end on small inputs (every command writes JSON with its resolved configuration)."""
import json

import numpy as np
import pytest

from weave_sim.cli import main
from weave_sim.traces import RoutingTrace, save_trace


def test_models(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v3" in out and "mixtral-8x7b" in out


def test_costmodel_writes_choice_and_config(tmp_path, capsys):
    rc = main(["costmodel", "--model", "qwen3-30b-a3b", "--gpus", "2", "--tokens", "256", "--synthetic", "uniform",
               "--layers", "0,3", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "costmodel.json").read_text())
    assert data["config"]["model_preset"]["name"] == "qwen3-30b-a3b"
    assert data["config"]["layer_ids"] == [0, 3]
    assert len(data["results"]["comm_sms"]) == 2 and all(1 <= c < 132 for c in data["results"]["comm_sms"][0])
    assert "bound" in capsys.readouterr().out


def test_foreign_trace_simulates(tmp_path):
    """A file written by someone else in the documented format (np.savez, int16 ids, extra keys)."""
    rng = np.random.default_rng(5)
    ids = np.argsort(rng.random((300, 16, 64)), axis=2)[:, :, :8].astype(np.int16)
    path = tmp_path / "theirs.npz"
    np.savez(path, topk_ids=ids, metadata=json.dumps({"model": "olmoe-1b-7b", "source": "test"}), junk=np.arange(3))
    assert main(["simulate", "--trace", str(path), "--gpus", "2", "--tokens", "128", "--layers", "0,5",
                 "--no-oracle", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert data["config"]["model_preset"]["name"] == "olmoe-1b-7b"
    assert [r["layer"] for r in data["results"]["layers"]] == [0, 5]
    assert all(r["latency_us"] >= b for r, b in zip(data["results"]["layers"], data["lower_bound_us"]))
    trace = json.loads(next(tmp_path.glob("timeline-layer*.json")).read_text())
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert events and {e["pid"] for e in events} == {0, 1}
    assert {"gemm0", "gemm1", "dispatch"} <= {e["name"] for e in events}
    assert len(list(tmp_path.glob("*.png"))) == 2


def test_sweep_speedups(tmp_path, capsys):
    rc = main(["sweep", "--model", "mixtral-8x7b", "--gpus", "2", "--tokens", "256", "--synthetic", "zipf",
               "--layers", "1", "--policies", "sequential,static:16,weave", "--static-grid", "8,16,32",
               "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "sweep.json").read_text())["results"]
    assert data["policies"] == ["sequential", "static:16", "weave"] and data["best_static"] in (8, 16, 32)
    assert data["speedup_vs_sequential_total"][0] == pytest.approx(1.0)
    assert "best single static split" in capsys.readouterr().out


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["simulate", "--trace", str(tmp_path / "missing.npz"), "--out", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["costmodel", "--model", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["costmodel", "--model", "mixtral-8x7b", "--gpus", "3", "--synthetic", "uniform", "--out", str(tmp_path)]) == 2
    assert "evenly" in capsys.readouterr().err


def test_trace_model_mismatch(tmp_path, capsys):
    ids = np.tile(np.arange(2), (10, 32, 1))
    path = save_trace(tmp_path / "t.npz", RoutingTrace(topk_ids=ids, metadata={"model": "mixtral-8x7b"}))
    assert main(["costmodel", "--trace", str(path), "--model", "gpt-oss-20b", "--out", str(tmp_path)]) == 2
    assert "mixtral" in capsys.readouterr().err


def test_default_trace_with_other_model_is_an_error(tmp_path, capsys):
    assert main(["costmodel", "--trace", "default", "--model", "deepseek-v3", "--out", str(tmp_path)]) == 2
    assert "mismatch" in capsys.readouterr().err


def test_custom_model_spec_end_to_end(tmp_path, capsys):
    """A geometry that is no preset: simulated directly, and through a generated trace whose metadata names it."""
    spec = "custom:H=1024:I=512:E=16:k=2:layers=3"
    assert main(["costmodel", "--model", spec, "--gpus", "2", "--tokens", "256", "--out", str(tmp_path)]) == 0
    preset = json.loads((tmp_path / "costmodel.json").read_text())["config"]["model_preset"]
    assert preset["name"] == "custom:E=16:k=2:H=1024:I=512:layers=3"
    assert (preset["num_experts"], preset["top_k"], preset["hidden_size"], preset["expert_ffn_size"],
            preset["num_moe_layers"]) == (16, 2, 1024, 512, 3)
    trace = tmp_path / "t.npz"
    assert main(["trace", "generate", "--kind", "zipf", "--model", spec, "--tokens", "512", "-o", str(trace)]) == 0
    assert main(["simulate", "--trace", str(trace), "--gpus", "2", "--tokens", "256", "--no-plots",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert data["config"]["model_preset"]["name"] == preset["name"]
    assert len(data["results"]["layers"]) == 3
    capsys.readouterr()
    assert main(["simulate", "--model", "custom:E=16:k=2", "--out", str(tmp_path)]) == 2
    assert "needs H, I" in capsys.readouterr().err
    assert main(["simulate", "--model", "custom:E=6:k=2:H=64:I=64", "--gpus", "4", "--out", str(tmp_path)]) == 2
    assert "evenly" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["simulate", "--layers", "0", "--timeline-layer", "5"], "not among the simulated layers"),
    (["simulate", "--layers", "0,0"], "names a layer twice"),
    (["simulate", "--layers", "a"], "comma-separated layer numbers"),
    (["simulate", "--seed", "-1"], "--seed must be >= 0"),
    (["simulate", "--trace", "default", "--synthetic", "uniform"], "not both"),
    (["simulate", "--model", "custom:E=64:k=8:H=64:I=64:layers=1024", "--tokens", "100000"], "more routing"),
    (["sweep", "--static-grid", "500"], "--static-grid values must lie in [1, 131]"),
    (["simulate", "--layers", "0", "--policy", "static:abc"], "static:abc: C and K must be integers"),
    (["simulate", "--layers", "0", "--policy", "static:20:x"], "C and K must be integers"),
    (["simulate", "--layers", "0", "--policy", "kernel:static:x"], "comm CTA counts must be integers"),
    (["simulate", "--layers", "0", "--policy", "kernel:static:4,8"], "one C for every GPU"),
    (["simulate", "--layers", "0", "--policy", "kernel:weave@a,b"], "comm CTA counts must be integers"),
    (["simulate", "--layers", "0", "--policy", "kernel:weave@"], "'@' needs the recorded choices"),
    (["sweep", "--layers", "0", "--policies", ","], "--policies names no policy"),
    (["validate", "--workers", "0"], "--workers must be >= 1"),
])
def test_run_flag_errors_are_one_line(tmp_path, capsys, argv, words):
    extra = [str(tmp_path / "bench.json")] if argv[0] == "validate" else ["--gpus", "2"]
    assert main(argv + extra + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_timeline_stats_and_validate_refuse_what_they_cannot_read(tmp_path, capsys):
    assert main(["simulate", "--gpus", "2", "--tokens", "128", "--layers", "0", "--no-oracle", "--quiet",
                 "--out", str(tmp_path)]) == 0
    trace = str(tmp_path / "timeline-layer0.json")
    for argv, words in [(["timeline-stats", trace, "--sms", "10"], "more than the 10 SMs"),
                        (["timeline-stats", trace, "--sms", "0"], "must be >= 1"),
                        (["timeline-stats", trace, "--from", "nosuch"], "no event named 'nosuch'"),
                        (["timeline-stats", str(tmp_path / "gantt-layer0.png")], "not a text (JSON) file"),
                        (["validate", str(tmp_path / "simulate.json")], "not a kernel benchmark file"),
                        (["validate", str(tmp_path / "gantt-layer0.png")], "not a text (JSON) file")]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        assert words in capsys.readouterr().err, argv
    capsys.readouterr()
    assert main(["timeline-stats", trace, "--sms", "132"]) == 0
    config = json.loads((tmp_path / "simulate.json").read_text())["config"]
    assert config["model"] == "gpt-oss-20b" and config["synthetic"] is None  # the shipped trace's model, no generator


def test_balanced_placement_per_layer(tmp_path):
    """--placement balanced: one placement per simulated layer, built from that layer's routing; the engine runs
    each layer on its own placement (the same latency as simulating that layer alone with it)."""
    from weave_sim.config import RunConfig, resolve
    from weave_sim.engine import simulate_model
    from weave_sim.placement import balanced_per_layer

    argv = ["--gpus", "4", "--tokens", "256", "--layers", "2,9", "--no-plots", "--quiet", "--out", str(tmp_path)]
    assert main(["simulate", "--placement", "balanced", *argv]) == 0
    data = json.loads((tmp_path / "simulate.json").read_text())
    res = resolve(RunConfig(num_gpus=4, tokens_per_gpu=256, layers=(2, 9), placement="balanced"))
    owners = [p.owner.tolist() for p in balanced_per_layer(res.routing, 32, 4)]
    assert data["config"]["placement_owner"] == owners and owners[0] != owners[1]
    alone = [simulate_model(res.routing[:, i:i + 1], res.model, res.placement[i], res.profile, "weave").total_ns
             for i in range(2)]
    assert [r["latency_us"] for r in data["results"]["layers"]] == pytest.approx([t / 1e3 for t in alone])


def test_policy_help_names_the_accepted_forms(capsys):
    """The help lists the policy forms the engine accepts (no top-level weave:C, which it refuses)."""
    for cmd in ("simulate", "sweep"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "static:C[:K], weave, oracle[:fast] or kernel:P" in out and "weave:C" not in out, cmd


def test_simulate_and_sweep_take_fp8_experts(tmp_path, capsys):
    """--expert-dtype fp8: the FP8 profile's tiles and e4m3 bytes, its own lower bound, recorded in the JSON; on the
    kernel's fitted profile the layers come out faster than bf16's and so does the bound."""
    base = ["--model", "qwen3-30b-a3b", "--gpus", "2", "--tokens", "512", "--synthetic", "zipf", "--layers", "0,1",
            "--profile", "h200-megakernel-ep2", "--no-plots", "--quiet"]
    out = {}
    for dt in ("bf16", "fp8"):
        assert main(["simulate", *base, "--expert-dtype", dt, "--out", str(tmp_path / dt)]) == 0
        out[dt] = json.loads((tmp_path / dt / "simulate.json").read_text())
        assert out[dt]["config"]["expert_dtype"] == dt
    assert "fp8 experts (e4m3" in capsys.readouterr().out
    assert out["fp8"]["results"]["total_us"] < out["bf16"]["results"]["total_us"]
    assert sum(out["bf16"]["lower_bound_us"]) / 2 <= sum(out["fp8"]["lower_bound_us"]) < sum(out["bf16"]["lower_bound_us"])
    assert main(["sweep", *base[:-2], "--policies", "static:20,weave", "--static-grid", "8,20", "--expert-dtype", "fp8",
                 "--out", str(tmp_path / "sw")]) == 0
    assert json.loads((tmp_path / "sw" / "sweep.json").read_text())["config"]["expert_dtype"] == "fp8"
    with pytest.raises(SystemExit):
        main(["simulate", *base, "--expert-dtype", "fp16", "--out", str(tmp_path)])
