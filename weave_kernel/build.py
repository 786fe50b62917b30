"""Build (once, cached by torch.utils.cpp_extension + ninja) and load the megakernel extension."""
from __future__ import annotations

import os
from pathlib import Path

# WEAVE_KERNEL_CSRC: build another copy of the sources instead (A/B runs of two kernel versions in one device
# session; give each its own TORCH_EXTENSIONS_DIR, the extension name stays the same). For both versions in one
# process (interleaved A/B timing: bench --ab-csrc), load_extension(csrc=DIR) builds DIR under a name of its own.
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
_OTHER: dict = {}
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".cpp")


def sources_digest(csrc: str | os.PathLike | None = None) -> str:
    """A fingerprint of the kernel sources in `csrc` (default: the ones load_extension builds): sha256 over every
    .cu/.cuh/.h/.cpp file's name and bytes, in name order. The benchmark records it (`kernel_sources`), `weave-sim
    calibrate --fit` copies it into the profile it fits, and `weave-sim validate` warns when a profile was fitted
    to other sources than the results it is checked against. Torch-free."""
    import hashlib

    src = Path(csrc) if csrc is not None else CSRC
    files = sorted(f for f in src.iterdir() if f.is_file() and f.suffix in SOURCE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no kernel sources in {src}")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()[:16]


def load_extension(verbose: bool = False, csrc: str | os.PathLike | None = None):
    """Compile (first call per cache folder) and import the extension. Needs CUDA, nvcc and ninja. With `csrc`,
    the sources in that folder instead, as a module named after the folder (weave_moe_ext_<hash>), so that two
    kernel versions can live in one process."""
    global _EXT
    if csrc is not None:
        src = Path(csrc).resolve()
        if src not in _OTHER:
            _OTHER[src] = _load(src, other_name(src), verbose)
        return _OTHER[src]
    if _EXT is None:
        _EXT = _load(CSRC, "weave_moe_ext", verbose)
    return _EXT


def other_name(src: Path) -> str:
    import hashlib

    return "weave_moe_ext_" + hashlib.sha1(str(src).encode()).hexdigest()[:10]


def _load(src: Path, name: str, verbose: bool):
    if not (src / "binding.cpp").is_file():
        raise FileNotFoundError(f"no kernel sources (binding.cpp) in {src}")
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    from torch.utils.cpp_extension import load

    return load(
        name=name,
        sources=[str(src / s) for s in SOURCES if s not in OPTIONAL_SOURCES or (src / s).is_file()],
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=list(CUDA_FLAGS),
        extra_include_paths=[str(src)],
        verbose=verbose,
    )
