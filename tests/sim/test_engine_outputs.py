"""Engine outputs and API: DAG volumes, policies, results, sweeps, Chrome trace, PNGs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from weave_sim.engine import simulate_layer, simulate_model, sweep
from weave_sim.engine.dag import C_GEMM, K_COMBINE, K_DISPATCH, KIND_NAMES, build_graph
from weave_sim.engine.plan import Plan
from weave_sim.engine.plots import plot_gantt, plot_latency_vs_c
from weave_sim.engine.testing import gumbel_routing, random_layer, tiny_model, tiny_profile
from weave_sim.engine.timeline import chrome_trace_events, write_chrome_trace
from weave_sim.placement import contiguous
from weave_sim.presets import get_model
from weave_sim.profile import load_profile
from weave_sim.workload import layer_workload

TRACE_NAMES = {"count_exchange", "dispatch", "gemm0", "gemm1", "combine", "reduce", "wait", "choose"}


@pytest.fixture(scope="module")
def layer():
    return random_layer(4, 256, tiny_model(256, 128, 16, 4), skew=1.0, seed=3)


@pytest.fixture(scope="module")
def profile():
    return tiny_profile(16)


def test_graph_volumes_match_workload(layer, profile):
    plan = Plan("p", (4,) * 4, (2,) * 4)
    for batch in (None, 32):
        g = build_graph(layer, profile, plan, tile_rows=32, tile_cols=32, gemm_tasks_per_sm=batch)
        gemm = g.cls == C_GEMM
        assert np.isclose(g.flops[gemm].sum(), layer.flops.sum())
        tiles = layer.gemm_tiles(32, 32).sum()  # workload counts GEMM0 tiles on I columns
        assert g.tiles[gemm].sum() == tiles
        disp, comb = g.kind == K_DISPATCH, g.kind == K_COMBINE
        assert np.array_equal(np.bincount(g.gpu[disp], g.nbytes[disp], 4), layer.dispatch_bytes_out)
        assert np.array_equal(np.bincount(g.peer[comb], g.nbytes[comb], 4), layer.combine_bytes_in)
        assert (g.chunk[gemm] < 2).all()


def test_batching_keeps_work_and_cuts_tasks():
    m = get_model("qwen3-30b-a3b")
    w = layer_workload(gumbel_routing(4 * 4096, m.num_experts, m.top_k, seed=1), m, contiguous(m.num_experts, 4))
    p = load_profile("h200")
    plan = Plan("p", (20,) * 4, (1,) * 4)
    fine = build_graph(w, p, plan, gemm_tasks_per_sm=None)
    coarse = build_graph(w, p, plan, gemm_tasks_per_sm=4)
    gf, gc = fine.cls == C_GEMM, coarse.cls == C_GEMM
    assert gc.sum() < gf.sum()
    assert fine.tiles[gf].sum() == coarse.tiles[gc].sum()
    assert np.isclose(fine.flops[gf].sum(), coarse.flops[gc].sum())


def test_policies_and_result_dict(layer, profile):
    out = {}
    for spec in ("sequential", "static:4", "static:4:2", "weave", "oracle:fast"):
        r = simulate_layer(layer, profile, spec, tile_rows=32, tile_cols=32)
        json.dumps(r.to_dict())
        out[spec] = r.latency_ns
        assert r.policy == spec and r.latency_ns > 0
    assert out["oracle:fast"] <= min(out["sequential"], out["weave"])
    assert out["sequential"] > out["static:4"]  # the host sync alone is 400 us


def test_unknown_policies_are_errors(layer, profile):
    with pytest.raises(ValueError, match="unknown policy"):
        simulate_layer(layer, profile, "magic")
    with pytest.raises(ValueError):
        simulate_layer(layer, profile, "static")
    with pytest.raises(ValueError):
        simulate_layer(layer, profile, "static:0")
    for bad in ({"tile_rows": 0}, {"jitter": -1.0}, {"fairness": "fifo"}, {"dispatch_order": "random"},
                {"comm_chunk_rows": 0}):
        with pytest.raises(ValueError):
            simulate_layer(layer, profile, "weave", **bad)
    with pytest.raises(TypeError):
        simulate_layer(layer, profile, "weave", tile_row=64)  # unknown options are errors


def test_model_and_sweep(profile):
    m = tiny_model(128, 128, 8, 2)
    routing = np.stack([gumbel_routing(128, 8, 2, seed=s) for s in range(3)], axis=1)
    place = contiguous(8, 2)
    res = simulate_model(routing, m, place, profile, "weave", layers=[0, 2])
    assert [r.layer for r in res.layers] == [0, 2]
    assert res.total_ns == sum(r.latency_ns for r in res.layers)
    json.dumps(res.to_dict())
    table = sweep(routing, m, place, profile, ["static:4", "weave"], static_grid=(2, 4, 8))
    assert table.latency_ns.shape == (3, 2)
    assert table.best_static in (2, 4, 8)
    assert table.best_static_ns.sum() == table.static_ns.sum(axis=0).min()
    assert table.speedup_vs_sequential().shape == table.speedup_vs_best_static().shape == (3, 2)
    assert np.array_equal(table.latency_ns[:, 0], table.static_ns[:, 1])  # static:4 run once, same result
    assert "total" in table.format()
    assert not res.layers[0].has_records and table.results[0, "weave"].graph is None
    with pytest.raises(ValueError, match="re-simulate"):
        plot_gantt(res.layers[0], "unused.png")
    kept = simulate_model(routing, m, place, profile, "weave", layers=[1], keep_records=True)
    assert kept.layers[0].has_records
    par = sweep(routing, m, place, profile, ["static:4", "weave"], static_grid=(2, 4, 8), workers=2)
    assert np.array_equal(par.latency_ns, table.latency_ns) and np.array_equal(par.static_ns, table.static_ns)
    json.dumps(table.to_dict())


def test_chrome_trace_schema(layer, profile, tmp_path):
    r = simulate_layer(layer, profile, "weave", tile_rows=32, tile_cols=32, record_timeline=True)
    path = write_chrome_trace(r, tmp_path / "t.json")
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in xs} <= TRACE_NAMES
    assert {"dispatch", "gemm0", "gemm1", "combine", "wait", "choose"} <= {e["name"] for e in xs}
    try:  # the kernel's trace uses the same names (weave_kernel may need torch: then skip this check)
        from weave_kernel.timeline import KIND_NAMES as KERNEL_KINDS
    except ImportError:
        KERNEL_KINDS = TRACE_NAMES
    assert TRACE_NAMES <= set(KERNEL_KINDS)
    assert all(set(e["args"]) == {"c_star", "k_star"} for e in xs if e["name"] == "choose")
    assert {e["cat"] for e in xs} <= {"comm", "compute"}
    assert all(0 <= e["pid"] < 4 and 0 <= e["tid"] < 16 and e["dur"] >= 0 for e in xs)
    busy = {}
    for e in xs:  # per thread, events (tasks and waits) never overlap and tile [0, GPU end]
        busy.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in busy.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:]))
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all({"egress", "ingress"} <= set(e["args"]) for e in counters)
    assert len(chrome_trace_events(simulate_layer(layer, profile, "static:4", tile_rows=32))) > 0


def test_pngs(layer, profile, tmp_path):
    r = simulate_layer(layer, profile, "weave", tile_rows=32, tile_cols=32)
    o = simulate_layer(layer, profile, "oracle:fast", tile_rows=32, tile_cols=32)
    for path in (plot_gantt(r, tmp_path / "g.png"),
                 plot_latency_vs_c(layer, profile, tmp_path / "c.png", chosen=r, oracle=o, grid=(2, 4, 8),
                                   tile_rows=32, tile_cols=32)):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kind_names_are_the_kernels():
    assert KIND_NAMES[:6] == ("count_exchange", "dispatch", "gemm0", "gemm1", "combine", "reduce")
