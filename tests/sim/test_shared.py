"""Shared (always-on) experts in the engine: SimOptions.shared 'off' / 'first' / 'last' (docs/engine.md)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from weave_sim.cli import main
from weave_sim.engine import simulate_layer, write_chrome_trace
from weave_sim.engine.dag import C_GEMM, K_BARRIER, K_GEMM0, K_GEMM1, K_REDUCE, SHARED_FIRST, SHARED_LAST, build_graph
from weave_sim.engine.plan import Plan
from weave_sim.engine.run import SimContext, SimOptions
from weave_sim.engine.testing import random_layer, simulated_bench_file, tiny_model, tiny_profile
from weave_sim.profile import load_profile
from weave_sim.validate import kernel_options, result_shared, validate_result
from weave_sim.workload import pairs_dispatched

from test_engine_invariants import check_invariants, plans, scenarios

POLICIES = ["sequential", "static:3", "weave", "kernel:sequential", "kernel:static:3", "kernel:weave"]
KERNEL = {"dispatch_order": "piece", "expert_pad_rows": 32}


def with_shared(w, n: int):
    """`w` with a model of n shared experts (the routed geometry unchanged)."""
    return dataclasses.replace(w, model=dataclasses.replace(w.model, num_shared_experts=n))


def layer(G: int, shared: int = 2, tokens: int = 150, seed: int = 3):
    return with_shared(random_layer(G, tokens * G, tiny_model(128, 96, 4 * G, 2), skew=1.0, seed=seed), shared)


def run(w, policy: str, **kw):
    opts = dict(KERNEL) if policy.startswith("kernel:") else {}
    if policy.startswith("kernel:"):
        w = pairs_dispatched(w)
    opts.update(kw)
    return simulate_layer(w, tiny_profile(12), policy, tile_rows=32, tile_cols=32, **opts)


def gemm_flops(r) -> float:
    g = r.graph
    sel = (g.kind == K_GEMM0) | (g.kind == K_GEMM1)
    return float(g.flops[sel].sum())


@pytest.mark.parametrize("policy", POLICIES)
def test_off_and_models_without_shared_experts_are_todays_results(policy):
    w = layer(2)
    base = run(w, policy)
    for r in (run(w, policy, shared="off"), run(with_shared(w, 0), policy, shared="first"),
              run(with_shared(w, 0), policy, shared="last")):
        assert r.latency_ns == base.latency_ns
        assert np.array_equal(r.start_ns, base.start_ns) and np.array_equal(r.end_ns, base.end_ns)
        assert r.graph.shared is None and "shared_expert" not in r.busy_by_kind_ns


@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("shared", ["first", "last"])
def test_shared_tasks_run_once_and_reduce_waits_for_them(G, policy, shared):
    w = layer(G)
    off = run(w, policy)
    ctx_opts = dict(KERNEL) if policy.startswith("kernel:") else {}
    r = run(w, policy, shared=shared)
    g = r.graph
    sh = g.shared > 0
    assert set(np.unique(g.shared[sh])) == {SHARED_FIRST if shared == "first" else SHARED_LAST}
    assert (g.cls[sh] == C_GEMM).all() and (g.chunk[sh] == -1).all()
    H, Is = w.model.hidden_size, w.model.shared_ffn_size
    T = np.asarray(w.tokens_per_gpu)
    # the extra tasks: the shared GEMMs and one gemm0_done barrier per shared 32-row block
    assert g.num_tasks - off.graph.num_tasks == sh.sum() + (-(-T // 32)).sum()
    # FLOPs: 6 H Is per token, rows padded to the kernel layout's pad_rows per 32-row block
    pad = ctx_opts.get("expert_pad_rows")
    rows = T if pad is None else -(-T // 32) * 32  # 32-row blocks, each padded to 32 rows
    assert gemm_flops(r) - gemm_flops(off) == pytest.approx(6.0 * H * Is * rows.sum(), rel=1e-12)
    assert float(g.flops[sh].sum()) == pytest.approx(6.0 * H * Is * rows.sum(), rel=1e-12)
    assert r.plan.num_comm_sms == off.plan.num_comm_sms  # the choice ignores shared work
    # More work never finishes much earlier; greedy list scheduling is not monotone in added work (Graham's
    # anomalies: a stolen shared tile moves a transfer, and the chain that ends last is another), so a few ns may go
    # either way (-10 ns of 15.5 us on 4 GPUs under weave, shared first).
    assert r.latency_ns >= off.latency_ns * 0.995
    assert r.busy_by_kind_ns["shared_expert"].sum() > 0
    for gpu in range(G):
        red = (g.kind == K_REDUCE) & (g.gpu == gpu)
        s1 = sh & (g.kind == K_GEMM1) & (g.gpu == gpu)
        assert s1.any() and r.start_ns[red].min() >= r.end_ns[s1].max()


@pytest.mark.parametrize("shared", ["first", "last"])
@pytest.mark.parametrize("policy", ["sequential", "static:3", "weave"])
def test_queue_position(policy, shared):
    """'first': no routed GEMM0 task starts before every shared GEMM0 task has started; 'last': no shared task
    starts before every routed GEMM task of its GPU has started (the engine's claims, without in-kernel deciders
    holding claimed tasks)."""
    w = layer(2, tokens=300)
    r = run(w, policy, shared=shared)
    g = r.graph
    for gpu in range(2):
        mine = g.gpu == gpu
        routed = mine & (g.cls == C_GEMM) & (g.shared == 0)
        sh = mine & (g.shared > 0)
        if shared == "first":
            assert r.start_ns[routed & (g.kind == K_GEMM0)].min() >= r.start_ns[sh & (g.kind == K_GEMM0)].max()
        else:
            assert r.start_ns[sh].min() >= r.start_ns[routed].max()


@pytest.mark.parametrize("shared", ["first", "last"])
@pytest.mark.parametrize("policy", ["sequential", "kernel:sequential"])
def test_sequential_ends_its_gemm_phase_after_the_shared_tiles(policy, shared):
    """Under `sequential` the shared tiles are GEMM-phase work: the phase boundary after the GEMMs (the kernel's
    grid barrier after its GEMM1 pass, then its combine phase; a launch when not fused) waits for them, so they
    never run during it (they used to: with the profile's boundary longer than the shared work, it hid there).
    """
    prof = tiny_profile(12, fixed_ns={"grid_barrier": 200_000, "launch": 200_000})
    opts = dict(KERNEL) if policy.startswith("kernel:") else {}
    w = pairs_dispatched(layer(2)) if policy.startswith("kernel:") else layer(2)
    off = simulate_layer(w, prof, policy, tile_rows=32, tile_cols=32, **opts)
    r = simulate_layer(w, prof, policy, tile_rows=32, tile_cols=32, shared=shared, **opts)
    g = r.graph
    boundary = prof.fixed_ns["grid_barrier" if policy.startswith("kernel:") else "launch"]
    for gpu in range(2):
        s1 = (g.shared > 0) & (g.kind == K_GEMM1) & (g.gpu == gpu)
        phase_end = (g.kind == K_BARRIER) & (g.chunk >= 0) & (g.gpu == gpu)
        assert phase_end.sum() == 1 and r.start_ns[phase_end].min() >= r.end_ns[s1].max()
        red = (g.kind == K_REDUCE) & (g.gpu == gpu)
        assert r.start_ns[red].min() >= r.end_ns[s1].max() + boundary
    assert r.latency_ns > off.latency_ns


def test_one_gpu_without_routed_work_still_runs_its_shared_expert():
    w = layer(2)
    w = dataclasses.replace(w, pair_counts=w.pair_counts * 0, dispatch_rows=w.dispatch_rows * 0)
    for shared in ("first", "last"):
        r = run(w, "static:3", shared=shared)
        assert (r.graph.shared > 0).sum() > 0 and r.latency_ns > run(w, "static:3").latency_ns


def test_priorities_and_graph_shape():
    w = layer(2)
    prof = tiny_profile(12)
    plan = Plan("static", (3, 3), (2, 2))
    off = build_graph(w, prof, plan, tile_rows=32, tile_cols=32)
    routed = (off.cls == C_GEMM)
    for shared in ("first", "last"):
        g = build_graph(w, prof, plan, tile_rows=32, tile_cols=32, shared=shared)
        sh, rt = g.shared > 0, (g.cls == C_GEMM) & (g.shared == 0)
        assert rt.sum() == routed.sum()
        if shared == "first":
            assert g.prio[sh].max() < g.prio[rt].min()
        else:
            assert g.prio[sh].min() > g.prio[rt].max()
        # per block: GEMM1 outranks GEMM0 of the same block, as for routed blocks (rb_prio)
        for gpu in range(2):
            p0 = np.unique(g.prio[sh & (g.kind == K_GEMM0) & (g.gpu == gpu)])
            p1 = np.unique(g.prio[sh & (g.kind == K_GEMM1) & (g.gpu == gpu)])
            assert np.array_equal(p0, p1 + 1)
            assert p0.size == -(-int(w.tokens_per_gpu[gpu]) // 32)


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="shared must be one of"):
        SimOptions(shared="middle")
    with pytest.raises(ValueError, match="shared must be one of"):
        build_graph(layer(1), tiny_profile(12), Plan("static", (3,), (1,)), shared="on")


def test_power_model_counts_the_shared_weights():
    w = layer(2)
    prof = load_profile("h200-megakernel-power-ep2")
    off = SimContext(w, prof, SimOptions(shared="off"))
    on = SimContext(w, prof, SimOptions(shared="last"))
    assert (on.weight_bytes - off.weight_bytes == 6 * w.model.hidden_size * w.model.shared_ffn_size).all()
    a, b = simulate_layer(w, prof, "static:20"), simulate_layer(w, prof, "static:20", shared="last")
    assert a.gemm_clock is not None and b.latency_ns >= a.latency_ns


def test_trace_marks_shared_tasks(tmp_path):
    r = simulate_layer(layer(2), tiny_profile(12), "weave", tile_rows=32, tile_cols=32, shared="first")
    doc = json.loads(write_chrome_trace(r, tmp_path / "t.json").read_text())
    marked = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("args", {}).get("shared") == "first"]
    assert len(marked) == int((r.graph.shared > 0).sum())
    assert {e["name"] for e in marked} == {"gemm0", "gemm1"}


@given(scenarios(), st.data())
def test_invariants_hold_with_shared_experts(scn, data):
    w, profile, opts = scn
    w = with_shared(w, data.draw(st.integers(1, 2)))
    shared = data.draw(st.sampled_from(["first", "last"]))
    opts = dataclasses.replace(opts, shared=shared)
    plan = data.draw(plans(w.num_gpus, profile.num_sms))
    note(f"plan={plan} shared={shared}")
    ctx = SimContext(w, profile, opts)
    res = ctx.simulate(plan)
    check_invariants(res, ctx.last_sim, w, profile)
    g = res.graph
    T = np.asarray(w.tokens_per_gpu)
    if T.sum() == 0:
        assert g.shared is None
        return
    pad = opts.segment_pad_rows or opts.expert_pad_rows
    tr = opts.tile_rows
    nb = -(-T // tr)
    full, last = T // tr, T - T // tr * tr
    rows = T if pad is None else full * (-(-tr // pad) * pad) + -(-last // pad) * pad
    assert float(g.flops[g.shared > 0].sum()) == pytest.approx(
        6.0 * w.model.hidden_size * w.model.shared_ffn_size * rows.sum(), rel=1e-12)
    for gpu in range(w.num_gpus):  # two priorities per block (GEMM1 one above GEMM0), distinct blocks
        assert np.unique(g.prio[(g.shared > 0) & (g.gpu == gpu)]).size == 2 * nb[gpu]
    for gpu in np.flatnonzero(T):
        red = (g.kind == K_REDUCE) & (g.gpu == gpu)
        s1 = (g.shared > 0) & (g.kind == K_GEMM1) & (g.gpu == gpu)
        assert res.start_ns[red].min() >= res.end_ns[s1].max()


def test_validate_simulates_a_fused_shared_result(tmp_path):
    path = simulated_bench_file(tmp_path / "b.json", tiny_profile(16, tile=64), 256, 128, tokens=256,
                                policies=("static:4",))
    r = json.loads(path.read_text())["results"][0]
    assert result_shared(r) == "off" and "shared" not in kernel_options(r)
    prof = tiny_profile(16, tile=64)
    off = validate_result(r, prof).predicted_ms["static:4"]
    last = {**r, "shared": "last", "shared_experts": 1}
    assert kernel_options(last)["shared"] == "last"
    on = validate_result(last, prof).predicted_ms["static:4"]
    assert on > off
    assert validate_result({**r, "shared": "last", "shared_experts": 0}, prof).predicted_ms["static:4"] == off
    assert validate_result({**r, "shared": "last", "inter_shared": 128}, prof).predicted_ms["static:4"] == on
    with pytest.raises(ValueError, match="not a multiple"):
        validate_result({**r, "shared": "last", "inter_shared": 100}, prof)
    with pytest.raises(ValueError, match="inter_shared"):
        validate_result({**r, "shared": "first"}, prof)  # model "m": no preset to take the count from
    with pytest.raises(ValueError, match="unknown shared"):
        result_shared({**r, "shared": "both"})


def test_cli_simulate_and_sweep_with_shared(tmp_path, capsys):
    argv = ["--model", "deepseek-v2-lite", "--gpus", "2", "--tokens", "128", "--synthetic", "uniform",
            "--layers", "0"]
    assert main(["simulate", *argv, "--no-plots", "--quiet", "--out", str(tmp_path / "off")]) == 0
    assert main(["simulate", *argv, "--shared", "last", "--no-oracle", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "shared experts last (2 x I = one FFN of width 2816 per GPU)" in out
    off = json.loads((tmp_path / "off" / "simulate.json").read_text())
    on = json.loads((tmp_path / "simulate.json").read_text())
    assert off["config"]["shared"] == "off" and on["config"]["shared"] == "last"
    assert on["results"]["total_us"] >= off["results"]["total_us"]
    assert on["lower_bound_us"][0] > off["lower_bound_us"][0]
    assert on["results"]["total_us"] >= on["lower_bound_us"][0]
    trace = json.loads((tmp_path / "timeline-layer0.json").read_text())
    assert any(e.get("args", {}).get("shared") == "last" for e in trace["traceEvents"])
    assert main(["sweep", *argv, "--shared", "first", "--policies", "static:16,weave", "--static-grid", "16",
                 "--quiet", "--out", str(tmp_path)]) == 0
    assert "shared experts first" in capsys.readouterr().out
    assert json.loads((tmp_path / "sweep.json").read_text())["config"]["shared"] == "first"
    with pytest.raises(SystemExit):
        main(["simulate", *argv, "--shared", "middle", "--out", str(tmp_path)])


def test_timeline_stats_counts_the_shared_tiles(tmp_path, capsys):
    """busy_stats and `weave-sim timeline-stats` report the shared expert's share of the GEMM work (events with
    args "shared", as both the kernel's and the simulator's traces mark them)."""
    import json

    from weave_sim.cli import main
    from weave_sim.timeline_stats import busy_stats

    ev = [{"ph": "X", "pid": 0, "tid": sm, "name": name, "cat": "compute", "ts": ts, "dur": 10.0, "args": args}
          for sm, name, ts, args in ((0, "gemm0", 0.0, {}), (0, "gemm0", 10.0, {"shared": 1}),
                                     (1, "gemm1", 0.0, {"shared": 1}), (1, "wait", 10.0, {}))]
    st = busy_stats({"traceEvents": ev})[0]
    assert st["shared_expert_us"] == 20.0 and st["work_us_by_kind"] == {"gemm0": 20.0, "gemm1": 10.0, "wait": 10.0}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    assert main(["timeline-stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "of which shared" in out and "50.0%" in out  # 20 us of a 20 us x 2 SM window
    no_shared = tmp_path / "u.json"
    no_shared.write_text(json.dumps({"traceEvents": ev[:1]}))
    main(["timeline-stats", str(no_shared)])
    assert "of which shared" not in capsys.readouterr().out
