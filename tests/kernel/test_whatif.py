"""weave_kernel.whatif: the simulator's prediction for de-duplicated dispatch (CPU only)."""
from __future__ import annotations

import numpy as np
import pytest

from weave_kernel.recount import counts_for
from weave_kernel.routing import skewed_routing
from weave_kernel.whatif import distinct_dispatch_rows, result_workload, whatif_result
from weave_sim.placement import contiguous
from weave_sim.profile import load_profile

CFG = {"seed": 3, "zipf": 1.0}  # the config of a results file: the seed and routing its results ran


def _result(top_k, tokens=256, experts=8, gpus=2):
    r = {"model": "tiny", "hidden": 256, "inter": 128, "experts": experts, "top_k": top_k, "gpus": gpus,
         "tokens_per_gpu": tokens, "kernel_layout": "expert-packed",
         "latency_ms": {"static:20": 0.1, "weave": 0.09}}
    r["counts"] = counts_for(r, CFG)
    return r


def test_distinct_rows_count_tokens_not_pairs():
    r = _result(top_k=4)
    rows = distinct_dispatch_rows(r, CFG)
    pairs = np.asarray(r["counts"]["dispatch_rows"])
    owner = contiguous(8, 2).owner
    for rank in range(2):  # brute force from the same routing
        ids, _ = skewed_routing(256, 8, 4, seed=3 * 100003 + rank * 7 + 256, zipf_s=1.0)
        for dst in range(2):
            assert rows[rank, dst] == int(np.any(owner[ids] == dst, axis=1).sum())
    assert np.all(rows <= pairs) and np.all(rows <= 256) and rows.sum() < pairs.sum()
    # top-1: a token goes to one expert, so distinct rows are the pairs
    r1 = _result(top_k=1)
    assert np.array_equal(distinct_dispatch_rows(r1, CFG), np.asarray(r1["counts"]["dispatch_rows"]))


def test_whatif_simulates_both_variants():
    out = whatif_result(_result(top_k=4), load_profile("h200-megakernel"), CFG)
    sent = out["dispatch_rows_sent"]
    assert sent["distinct"] < sent["pairs"]
    for side in ("as_built", "changed"):
        assert all(t > 0 for t in out[side].values())
    assert out["bound_ms"] > 0
    assert out["measured_ms"] == {"kernel:static:20": 0.1, "kernel:weave": 0.09}


def test_whatif_faster_gemm_is_never_slower_and_bad_variant_is_named():
    import pytest

    from weave_kernel.whatif import parse_variant

    r = _result(top_k=4, tokens=1024)
    out = whatif_result(r, load_profile("h200-megakernel"), CFG, variant="gemm:1.5")
    for p in out["as_built"]:
        assert out["changed"][p] <= out["as_built"][p] * 1.0001, p
    assert out["dispatch_rows_sent"]["distinct"] == out["dispatch_rows_sent"]["pairs"]  # dispatch unchanged
    for bad in ("gemm:0", "gemm:x", "fast"):
        with pytest.raises(ValueError, match="unknown variant"):
            parse_variant(bad)


def test_whatif_energy_needs_a_power_profile_and_never_slows():
    import pytest

    r = _result(top_k=4, tokens=1024)
    with pytest.raises(ValueError, match="power model"):
        whatif_result(r, load_profile("h200-megakernel"), CFG, variant="energy:0.9")
    out = whatif_result(r, load_profile("h200-megakernel-power"), CFG, variant="energy:0.5")
    for p in out["as_built"]:
        assert out["changed"][p] <= out["as_built"][p] * 1.0001, p
    # a cap this small layer does reach (130 W): half the energy per FLOP buys clock, so time
    from weave_sim.profile import profile_from_dict

    raw = load_profile("h200-megakernel-power").to_dict()
    low = profile_from_dict({**raw, "power": {**raw["power"], "cap_w": 130.0}})
    out = whatif_result(r, low, CFG, variant="energy:0.5")
    for p in out["as_built"]:
        assert out["changed"][p] < out["as_built"][p] * 0.99, p


def test_whatif_cli_names_missing_counts(tmp_path, capsys):
    import json

    import pytest

    from weave_kernel.whatif import main

    r = _result(top_k=2)
    del r["counts"]
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"config": {"seed": 3}, "results": [r]}))
    with pytest.raises(SystemExit):
        main([str(path)])
    assert "without the exchanged counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(path), "--tokens", "999"])
    assert "no results at those token counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(path), "--tokens", "4096,x"])
    assert "--tokens must be comma-separated integers" in capsys.readouterr().err


def test_whatif_simulates_the_grid_the_benchmark_ran_on():
    """A bench --num-ctas result is simulated on that many SMs, as weave-sim validate does."""
    r = {**_result(top_k=4, tokens=2048), "hidden": 2048, "inter": 1024}  # enough tiles for the grid to matter
    full = whatif_result(r, load_profile("h200-megakernel"), CFG)
    small = whatif_result({**r, "num_ctas": 32}, load_profile("h200-megakernel"), CFG)
    assert all(small["as_built"][p] > full["as_built"][p] for p in full["as_built"])


def test_whatif_pad_charges_fewer_mma_rows_and_checks_r():
    import pytest

    from weave_kernel.whatif import parse_variant

    assert parse_variant("pad:64") == ("pad", 64.0)
    for bad in ("pad:0", "pad:48", "pad:256", "pad:x"):
        with pytest.raises(ValueError, match="pad:R needs R dividing 128"):
            parse_variant(bad)
    # 1000 tokens x top-2 over 8 experts on 2 GPUs: about 500 rows per expert, a partial last block each; the
    # weights are shared by 4 blocks, so a tile's MMAs (not its HBM share) set its time and padding shows
    # (hidden and inter 2048: big enough that the tiles, not the dispatch pieces, set the layer's time)
    r = {**_result(top_k=2, tokens=1000), "hidden": 2048, "inter": 2048}
    out = whatif_result(r, load_profile("h200-megakernel"), CFG, variant="pad:16")
    for p in out["as_built"]:
        assert out["changed"][p] < out["as_built"][p], p
    same = whatif_result(r, load_profile("h200-megakernel"), CFG, variant="pad:128")
    assert same["changed"] == same["as_built"]
    with pytest.raises(ValueError, match="expert-packed"):
        whatif_result({**r, "kernel_layout": "segment-padded"}, load_profile("h200-megakernel"), CFG, variant="pad:64")


def test_whatif_faster_push_never_slows_and_helps_a_link_bound_layer():
    r = _result(top_k=4, tokens=1024)
    out = whatif_result(r, load_profile("h200-megakernel"), CFG, variant="push:2")
    for p in out["as_built"]:
        assert out["changed"][p] <= out["as_built"][p] * 1.0001, p
    assert out["changed"]["kernel:static:20"] < out["as_built"]["kernel:static:20"]


def test_whatif_nosteal_changes_only_weave_and_matches_the_engine_policy():
    from weave_sim.engine import simulate_layer
    from weave_kernel.whatif import result_workload
    from weave_sim.validate import kernel_options

    r = _result(top_k=4, tokens=1024)
    prof = load_profile("h200-megakernel")
    out = whatif_result(r, prof, CFG, variant="nosteal")
    assert out["changed"]["kernel:static:20"] == out["as_built"]["kernel:static:20"]
    want = simulate_layer(result_workload(r), prof, "kernel:weave-nosteal", **kernel_options(r)).latency_ns / 1e6
    assert out["changed"]["kernel:weave"] == want
    assert out["as_built"]["kernel:weave"] == simulate_layer(result_workload(r), prof, "kernel:weave",
                                                             **kernel_options(r)).latency_ns / 1e6


def test_whatif_decide_moves_only_weave_and_only_forward():
    """decide:NS: the same profile (decision NS) on both sides; every SM waiting for it (before 9caebac) is never
    faster than only the deciding SMs waiting, the gap grows with NS, and static:20 does not move."""
    import pytest

    from weave_kernel.whatif import parse_variant

    r = _result(top_k=4, tokens=512)
    prof = load_profile("h200-megakernel")
    assert parse_variant("decide:8000") == ("decide", 8000.0)
    with pytest.raises(ValueError, match="decide:NS"):
        parse_variant("decide:0")
    small, big = (whatif_result(r, prof, CFG, variant=f"decide:{ns}") for ns in (600, 40_000))
    for out in (small, big):
        assert out["changed"]["kernel:static:20"] == out["as_built"]["kernel:static:20"]
        assert out["as_built"]["kernel:weave"] >= out["changed"]["kernel:weave"]
    assert (big["as_built"]["kernel:weave"] - big["changed"]["kernel:weave"]
            > small["as_built"]["kernel:weave"] - small["changed"]["kernel:weave"])


def test_whatif_queue_deals_pieces_from_a_ticket_on_the_kernel_layout_only():
    import pytest

    from weave_kernel.whatif import parse_variant
    from weave_sim.engine import simulate_layer
    from weave_sim.validate import kernel_options

    assert parse_variant("queue") == ("queue", 1.0)
    r = _result(top_k=4, tokens=512)
    prof = load_profile("h200-megakernel")
    out = whatif_result(r, prof, CFG, variant="queue")
    w = result_workload(r)
    want = simulate_layer(w, prof, "kernel:static:20", piece_deal="queue", **kernel_options(r)).latency_ns / 1e6
    assert out["changed"]["kernel:static:20"] == pytest.approx(want)
    with pytest.raises(ValueError, match="queue models"):
        whatif_result({**r, "kernel_layout": "segment-padded"}, prof, CFG, variant="queue")


def test_whatif_piece_cost_never_slows_when_cheaper():
    import pytest

    from weave_kernel.whatif import parse_variant

    assert parse_variant("piece:0") == ("piece", 0.0)
    with pytest.raises(ValueError, match="piece:NS"):
        parse_variant("piece:-5")
    r = _result(top_k=4, tokens=512)
    prof = load_profile("h200-megakernel")
    out = whatif_result(r, prof, CFG, variant="piece:0")
    for p in out["as_built"]:
        assert out["changed"][p] <= out["as_built"][p]
    dear = whatif_result(r, prof, CFG, variant="piece:50000")
    assert dear["changed"]["kernel:static:20"] > dear["as_built"]["kernel:static:20"]


def test_whatif_simulates_a_results_fused_shared_expert():
    """A bench --shared result (its "shared" and "inter_shared"): the workload carries the shared FFN's width, the
    engine computes it (kernel_options pass "shared"), both sides pay for it, and the bound computed here counts
    its FLOPs; a result without "shared" is simulated as before."""
    import pytest

    from weave_kernel.whatif import result_bound_ms
    from weave_sim.engine import simulate_layer
    from weave_sim.validate import kernel_options

    r = _result(top_k=4, tokens=512)
    prof = load_profile("h200-megakernel")
    shared = {**r, "shared": "last", "inter_shared": 256}  # two shared experts of I = 128
    assert result_workload(r).model.shared_ffn_size == 0
    assert result_workload(shared).model.shared_ffn_size == 256
    off, on = whatif_result(r, prof, CFG, variant="gemm:1.5"), whatif_result(shared, prof, CFG, variant="gemm:1.5")
    for side in ("as_built", "changed"):
        for p in off[side]:
            assert on[side][p] > off[side][p], (side, p)
    assert on["as_built"]["kernel:weave"] == simulate_layer(result_workload(shared), prof, "kernel:weave",
                                                            **kernel_options(shared)).latency_ns / 1e6
    # no "lower_bound_ms" in these results: computed here, with the shared FLOPs (this tiny layer's bound is the
    # link's until the shared FFN is wide enough)
    assert on["bound_ms"] >= off["bound_ms"]
    assert result_bound_ms({**shared, "inter_shared": 16384}, CFG) > off["bound_ms"]
    assert whatif_result({**shared, "shared": "off"}, prof, CFG, variant="gemm:1.5") == off
    with pytest.raises(ValueError, match="not a multiple"):
        result_workload({**shared, "inter_shared": 100})


def test_whatif_and_gap_warn_when_the_profile_fits_another_kernel(tmp_path, capsys):
    """As weave-sim validate does: a profile fitted to other kernel sources than the file measured is named on
    stderr (the shipped h200-megakernel was fitted to an older kernel), and the table still comes out."""
    import json

    from weave_kernel import gap, whatif
    from weave_sim.benchfile import bench_kernel_sources

    fitted = load_profile("h200-megakernel").raw["calibration"]["kernel_sources"]
    path = tmp_path / "b.json"
    for sources, warned in [("sha256:0000000000000000", True), (fitted, False)]:
        path.write_text(json.dumps({"config": CFG, "kernel_sources": {"main": sources}, "results": [_result(2)]}))
        assert bench_kernel_sources(json.loads(path.read_text())) == sources
        for tool in (whatif, gap):
            assert tool.main([str(path), "--profile", "h200-megakernel"]) == 0
            out, err = capsys.readouterr()
            assert "simulator (h200-megakernel)" in out
            assert ("was fitted to kernel sources" in err) == warned, (tool.__name__, sources)


def test_whatif_fp8_halves_the_bytes_and_never_slows():
    """fp8:S: e4m3 weights and dispatch rows (with their scales) and tiles S times faster. With S = 1 only the bytes
    change: never slower; with S > 1 faster than S = 1. A power profile keeps the power of the bf16 tiles."""
    import pytest

    from weave_kernel.whatif import fp8_profile, parse_variant

    r = _result(top_k=4, tokens=1024)
    prof = load_profile("h200-megakernel")
    bytes_only = whatif_result(r, prof, CFG, variant="fp8:1")
    faster = whatif_result(r, prof, CFG, variant="fp8:1.5")
    for p in bytes_only["as_built"]:
        assert bytes_only["changed"][p] <= bytes_only["as_built"][p] * 1.0001, p
        assert faster["changed"][p] < bytes_only["changed"][p], p
    assert parse_variant("fp8:1.41") == ("fp8", 1.41)
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variant("fp8:0")
    p8 = fp8_profile(load_profile("h200-megakernel-power"), 1.5)
    base = load_profile("h200-megakernel-power")
    assert p8.gemm_peak_tflops == 2 * base.gemm_peak_tflops
    assert p8.raw["power"]["w_per_tflops"] == pytest.approx(base.raw["power"]["w_per_tflops"] / 1.5)


def test_whatif_fp8_on_a_result_that_ran_fp8_is_refused():
    """fp8:S asks what FP8 experts would change; a bench --expert-dtype fp8 result already ran them (its as-built
    simulation is FP8 already, weave_sim.validate.profile_for_result)."""
    r = _result(top_k=4)
    whatif_result(r, load_profile("h200-megakernel"), CFG, variant="fp8:1.25")
    with pytest.raises(ValueError, match="already ran them"):
        whatif_result({**r, "expert_dtype": "fp8"}, load_profile("h200-megakernel"), CFG, variant="fp8:1.25")


def test_the_bound_of_an_fp8_result_is_the_fp8_one():
    """gap / whatif measure an FP8 result against FP8's bound (e4m3 bytes, FP8 peak): bench's fp8_lower_bound_ms
    when the result has it, else computed here, below the bf16 bound and at least half of it."""
    from weave_kernel.whatif import result_bound_ms

    r = _result(top_k=2, tokens=64)
    bf = result_bound_ms(r, CFG)
    f8 = result_bound_ms({**r, "expert_dtype": "fp8"}, CFG)
    assert bf / 2 <= f8 < bf
    assert result_bound_ms({**r, "expert_dtype": "fp8", "lower_bound_ms": 9.0, "fp8_lower_bound_ms": 4.0}, CFG) == 4.0
    assert result_bound_ms({**r, "lower_bound_ms": 9.0, "fp8_lower_bound_ms": 4.0}, CFG) == 9.0


def test_whatif_combines_variants_in_order():
    """'a+b' applies both to the changed side: FP8 experts whose rows also go 2x faster per comm CTA. The two
    transforms touch different parts of the profile, so their order does not matter; the pair moves static:20
    further than FP8 alone (its push-bound dispatch gets faster), and nosteal combines with them."""
    from weave_kernel.whatif import parse_variants
    from weave_sim.engine import simulate_layer
    from weave_sim.validate import kernel_options

    r = _result(top_k=4, tokens=1024)
    prof = load_profile("h200-megakernel")
    assert parse_variants("fp8:1.25+push:2") == [("fp8", 1.25), ("push", 2.0)]
    both = whatif_result(r, prof, CFG, variant="fp8:1.25+push:2")
    swapped = whatif_result(r, prof, CFG, variant="push:2+fp8:1.25")
    fp8 = whatif_result(r, prof, CFG, variant="fp8:1.25")
    assert both["changed"] == swapped["changed"] and both["as_built"] == fp8["as_built"]
    assert both["changed"]["kernel:static:20"] < fp8["changed"]["kernel:static:20"]
    ns = whatif_result(r, prof, CFG, variant="fp8:1.25+push:2+nosteal")
    assert ns["changed"]["kernel:static:20"] == both["changed"]["kernel:static:20"]
    from weave_kernel.whatif import fp8_profile, rescaled
    want = simulate_layer(result_workload(r), rescaled(fp8_profile(prof, 1.25), push=2.0), "kernel:weave-nosteal",
                          **{**kernel_options(r), "expert_dtype": "fp8"}).latency_ns / 1e6
    assert ns["changed"]["kernel:weave"] == want
    for bad, match in (("fp8:1.25+decide:600", "cannot be combined"), ("push:2+push:3", "at most once"),
                       ("fp8:1.25+fast", "unknown variant")):
        with pytest.raises(ValueError, match=match):
            parse_variants(bad)
