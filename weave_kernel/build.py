"""Build (once, cached by torch.utils.cpp_extension + ninja) and load the megakernel extension."""
from __future__ import annotations

import os
from pathlib import Path

# WEAVE_KERNEL_CSRC: build another copy of the sources instead (A/B runs of two kernel versions in one device
# session; give each its own TORCH_EXTENSIONS_DIR, the extension name stays the same)
CSRC = Path(os.environ.get("WEAVE_KERNEL_CSRC") or Path(__file__).resolve().parent / "csrc")
SOURCES = ("binding.cpp", "launch.cu", "calib.cu")
OPTIONAL_SOURCES = {"calib.cu"}  # absent from copies of csrc/ older than the calibration kernels (A/B runs)
CUDA_FLAGS = (
    "-gencode=arch=compute_90a,code=sm_90a",
    "-O3",
    "-DNDEBUG",
    "-std=c++17",
    "-lineinfo",
    "--expt-relaxed-constexpr",
)
_EXT = None


def load_extension(verbose: bool = False):
    """Compile (first call per cache folder) and import the extension. Needs CUDA, nvcc and ninja."""
    global _EXT
    if _EXT is not None:
        return _EXT
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    from torch.utils.cpp_extension import load

    _EXT = load(
        name="weave_moe_ext",
        sources=[str(CSRC / s) for s in SOURCES if s not in OPTIONAL_SOURCES or (CSRC / s).is_file()],
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=list(CUDA_FLAGS),
        extra_include_paths=[str(CSRC)],
        verbose=verbose,
    )
    return _EXT
