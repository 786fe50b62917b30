"""weave_kernel.piece_cost on the committed EP=2 weave traces (CPU only): every dispatch record is one rebuilt piece,
each SM's pieces are dealt round-robin, and the fit holds a fixed cost per piece."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from weave_kernel.piece_cost import analyse, joint_fit, main, piece_table

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted((ROOT / "docs" / "results").glob("kernel_trace_weave_*_4096.json"))


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_every_record_is_a_rebuilt_piece_dealt_round_robin(trace):
    r = analyse(trace, seed=0, zipf=1.0)
    assert r["mismatched"] == 0 and r["matched"] == sum(g["records"] for g in r["per_gpu"].values())
    assert all(g["round_robin"] and g["pieces"] == g["records"] for g in r["per_gpu"].values())
    from weave_sim.presets import get_model

    row = get_model(r["model"]).hidden_size * 2
    assert min(r["bytes"]) >= row and max(r["bytes"]) == 128 * row  # 1 to 128 rows, full blocks among them
    assert 4.0 < r["fixed_us"] < 7.0  # the measured fixed cost per piece, each trace on its own


def test_another_seed_does_not_match():
    with pytest.raises(ValueError, match="match no rebuilt piece"):
        analyse(TRACES[0], seed=5, zipf=3.0)


def test_joint_fit_recovers_a_known_line():
    rng = np.random.default_rng(0)
    b = [rng.integers(1, 2**20, 50), rng.integers(1, 2**20, 40)]
    d = [4.0 + b[0] / 10e3, 4.0 + b[1] / 20e3]  # 4 us, then bytes at 10 and 20 GB/s (= 10e3 / 20e3 bytes per us)
    f = joint_fit(b, d)
    assert f["fixed_us"] == pytest.approx(4.0) and f["cta_gbs"] == pytest.approx([10.0, 20.0])
    assert f["resid_rms_us"] < 1e-9


def test_piece_rows_sum_to_the_pairs_sent():
    from weave_kernel.recount import counts_for
    from weave_sim.presets import get_model

    m = get_model("deepseek-v2-lite")
    res = {"gpus": 2, "tokens_per_gpu": 512, "experts": m.num_experts, "top_k": m.top_k}
    c = counts_for(res, {"seed": 1, "zipf": 1.0})
    t = piece_table(c, m, 2)
    rows = np.asarray(c["dispatch_rows"])
    for s in range(2):
        r, blk = t[s][1 - s]
        assert r.sum() == rows[s, 1 - s] and (r >= 1).all() and (r <= 128).all() and len(set(blk)) == len(blk)


def test_cli_writes_the_fit(tmp_path, capsys):
    out = tmp_path / "piece.json"
    assert main([str(p) for p in TRACES] + ["--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert 4000 < d["dispatch_piece_ns"] < 7000 and len(d["traces"]) == len(TRACES)
    assert "one fixed cost" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.json")])


def test_not_a_trace_is_named(capsys):
    with pytest.raises(SystemExit):
        main([str(ROOT / "docs" / "results" / "calib_2xh200_ws.json")])
    assert "not a megakernel trace" in capsys.readouterr().err


def test_a_file_that_is_not_json_is_named(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text("not json")
    with pytest.raises(SystemExit):
        main([str(TRACES[0]), str(bad)])
    assert f"{bad}: Expecting value" in capsys.readouterr().err
