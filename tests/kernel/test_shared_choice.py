"""tests/kernel/shared_choice.py (the in-kernel choice with or without the shared work; CPU only, small configs)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import shared_choice  # noqa: E402


def test_the_three_schedules_and_their_regrets():
    r = shared_choice.shared_choice("deepseek-v2-lite", 2, 512, "h200-megakernel-ep2", "last", grid=(4, 16))
    assert r["inter_shared"] == 2 * 1408 and len(r["c_star"]) == len(r["c_shared"]) == 2
    assert r["oracle_ms"] == min(r["sweep_ms"].values()) == r["sweep_ms"][str(r["best_c"])]
    assert r["regret"] == pytest.approx(r["weave_ms"] / r["oracle_ms"] - 1)
    assert r["regret_shared_choice"] == pytest.approx(r["weave_shared_choice_ms"] / r["oracle_ms"] - 1)
    assert r["weave_ms"] > r["weave_shared_off_ms"]  # the shared FFN costs time
    if r["c_shared"] == r["c_star"]:  # '@' keeps weave's decision cost: the same split is the same schedule
        assert r["weave_shared_choice_ms"] == r["weave_ms"]
    # on this layer (as on every one of docs/results/shared/shared_choice.txt) the shared FLOPs pull c down, never up
    assert all(cs <= c for cs, c in zip(r["c_shared"], r["c_star"]))
    off = shared_choice.shared_choice("deepseek-v2-lite", 2, 512, "h200-megakernel-ep2", "off", grid=(4, 16))
    assert off["c_shared"] == off["c_star"] == r["c_star"] and off["weave_ms"] == r["weave_shared_off_ms"]


def test_cli_prints_the_table(capsys, tmp_path):
    import json

    out = tmp_path / "s.json"
    assert shared_choice.main(["--models", "deepseek-v2-lite", "--gpus", "2", "--tokens", "256", "--grid", "8",
                               "--jobs", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "shared expert last" in text and "EP=2: geomean (a)/(b)" in text
    assert json.loads(out.read_text())["rows"][0]["best_c"] == 8
