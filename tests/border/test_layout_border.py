"""The kernel layout the simulator models (weave_sim.validate KERNEL_LAYOUTS, kernel_layout_for) against the kernel
sources that define it: the tile height, the half-tile threshold and which instances run half tiles."""
import re
from pathlib import Path

from weave_sim.validate import KERNEL_LAYOUTS, kernel_layout_for

CSRC = Path(__file__).resolve().parents[2] / "weave_kernel" / "csrc"


def _block_m() -> int:
    m = re.search(r"static constexpr int kBlockM = (\d+);", (CSRC / "config.cuh").read_text())
    assert m, "config.cuh: kBlockM not found"
    return int(m.group(1))


def test_pad_rows_are_the_kernels_tile_and_half_tile():
    bm = _block_m()
    assert KERNEL_LAYOUTS["expert-packed"]["expert_pad_rows"] == bm
    assert KERNEL_LAYOUTS["expert-packed-half"]["expert_pad_rows"] == bm // 2
    # the kernel's test for a half tile: at most half a tile's rows
    assert "is_half_tile(int num_rows) { return num_rows <= Config::kBlockM / 2; }" in (CSRC / "wgmma.cuh").read_text()


def test_the_instances_with_half_tiles():
    """MoeTiles (tasks.cuh): the split form (kHalf) in bf16 and FP8 tiles of the kernel without the shared expert's
    code, the idle form (kIdleHalf) in bf16 tiles of the kernel with it; kernel_layout_for names the same instances."""
    tasks = (CSRC / "tasks.cuh").read_text()
    assert "static constexpr bool kHalf = !kShared;" in tasks
    assert "static constexpr bool kIdleHalf = kShared && !F8;" in tasks
    for fp8 in (False, True):
        for shared in (False, True):
            half = not (shared and fp8)
            assert (kernel_layout_for("fp8" if fp8 else "bf16", shared) == "expert-packed-half") == half
