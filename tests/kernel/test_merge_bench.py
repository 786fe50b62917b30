"""tests/kernel/merge_bench.py: benchmark files merged for one fit (CPU)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED0 = ROOT / "docs/results/ep1/kernel_bench_ep1_seed0.json"
DECODE = ROOT / "docs/results/graphs/bench_decode_ep1.json"


def test_merge_keeps_every_result_with_its_deciders_and_names_its_inputs(kernel_script, tmp_path):
    mb = kernel_script("merge_bench")
    a, b = (json.loads(p.read_text()) for p in (SEED0, DECODE))
    out = tmp_path / "m.json"
    assert mb.main([str(out), str(SEED0), str(DECODE)]) == 0
    m = json.loads(out.read_text())
    assert len(m["results"]) == len(a["results"]) + len(b["results"])
    assert [r["tokens_per_gpu"] for r in m["results"]] == [r["tokens_per_gpu"] for r in a["results"] + b["results"]]
    assert all("kernel_deciders" in r for r in m["results"])
    assert m["config"]["merged_from"] == [str(SEED0), str(DECODE)] and str(DECODE) in m["header"]
    assert "weave_geomeans" not in m
    # the fit input of the shipped h200-megakernel-power-ep1-pad is this merge
    shipped = json.loads((ROOT / "docs/results/pad_energy/fit_input_ep1_seed0_and_decode.json").read_text())
    assert shipped["results"] == m["results"]


def test_merge_refuses_what_it_cannot_merge(kernel_script, tmp_path):
    mb = kernel_script("merge_bench")
    with pytest.raises(ValueError, match="at least two"):
        mb.merge([str(SEED0)])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="not a kernel benchmark file"):
        mb.merge([str(SEED0), str(bad)])
    assert mb.main([str(tmp_path / "o.json"), str(SEED0), str(tmp_path / "missing.json")]) == 2
