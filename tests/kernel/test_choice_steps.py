"""tests/kernel/choice_steps.py without a GPU: its anchored patch applies to the shipped sources (both variants)
and its records are read back per step."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import choice_steps  # noqa: E402

from weave_kernel.build import CSRC  # noqa: E402


@pytest.mark.parametrize("warm", [False, True])
def test_patch_applies_to_the_shipped_sources(tmp_path, warm):
    dst = choice_steps.patched_csrc(CSRC, tmp_path, warm_call=warm)
    ch = (dst / "choice.cuh").read_text()
    assert ch.count("%%globaltimer") == len(choice_steps.CHOICE_ANCHORS)
    mk = (dst / "megakernel.cuh").read_text()
    assert "s.red_sums, s.red_best, cst);" in mk or "rep ? cst : nullptr);" in mk
    assert ("for (int rep = 0; rep < 2; ++rep)" in mk) == warm
    assert (CSRC / "choice.cuh").read_text().count("%%globaltimer") == 0  # the shipped copy is untouched


def test_patch_stops_when_an_anchor_is_gone(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for f in CSRC.iterdir():
        (src / f.name).write_text(f.read_text().replace("  uint64_t tc = 0;\n", "  uint64_t tc = 1;\n"))
    with pytest.raises(SystemExit, match="anchor"):
        choice_steps.patched_csrc(src, tmp_path / "out")


def test_step_durations_by_record():
    ev = [{"name": "choose", "args": {"c_star": 3, "k_star": 1}, "dur": 9.0},
          {"name": "choose", "args": {"row_block": -2, "col_block_or_rank": 0}, "dur": 0.4},
          {"name": "choose", "args": {"row_block": -5, "col_block_or_rank": 0}, "dur": 2.5},
          {"name": "choose", "args": {"row_block": -7, "col_block_or_rank": 0}, "dur": 1.0},
          {"name": "choose", "args": {"row_block": -20, "col_block_or_rank": 0}, "dur": 7.5},
          {"name": "gemm0", "args": {"row_block": -2, "col_block_or_rank": 0}, "dur": 40.0}]
    d = choice_steps.step_durations(ev)
    assert d["whole"] == [9.0] and d["first"] == [7.5]
    assert d["volumes"] == [0.4] and d["argmin"] == [2.5] and d["pick"] == [1.0] and d["sums"] == []
