"""tests/kernel/steal_join_ab.py's CPU parts: the join-delay patch of the kernel sources and the tile medians."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def sj(kernel_script):
    return kernel_script("steal_join_ab")


def test_patch_finds_its_anchors_and_adds_the_wait(sj, tmp_path):
    src = sj.patched_csrc(1234, tmp_path)
    text = (src / "megakernel.cuh").read_text()
    assert text.count("join_t0 + 1234ull * 1000ull") == 1
    # the wait sits right before the comm CTAs' join, the clock right before the routing phase
    assert text.index("while (globaltimer_ns() < join_t0") < text.index(sj.ANCHOR_JOIN)
    assert text.index("const uint64_t join_t0") < text.index(sj.ANCHOR_T0)
    assert (src / "binding.cpp").is_file()  # the rest of the sources came along


def test_tile_medians_take_gemm0_of_compute_ctas_by_start(sj):
    ev = [{"name": "count_exchange", "cat": "compute", "ts": 0.0, "dur": 5.0}]
    ev += [{"name": "gemm0", "cat": "compute", "ts": 10.0 + i, "dur": 30.0 + i} for i in range(3)]  # before 100
    ev += [{"name": "gemm0", "cat": "compute", "ts": 200.0 + i, "dur": 50.0} for i in range(2)]  # after
    ev += [{"name": "gemm1", "cat": "compute", "ts": 300.0, "dur": 5.0},  # another kind
           {"name": "gemm0", "cat": "comm", "ts": 300.0, "dur": 500.0}]  # a stealing comm CTA's tile
    assert sj.tile_medians(ev, 100.0) == (31.0, 50.0, 3, 2)
    b, a, nb, na = sj.tile_medians(ev, 1e9)
    assert (nb, na) == (5, 0) and a != a  # nothing after: NaN
