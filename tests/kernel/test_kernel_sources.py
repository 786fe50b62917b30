"""weave_kernel.build.sources_digest: the kernel-sources fingerprint the benchmark records (CPU only)."""
from __future__ import annotations

import re
import shutil

import pytest

from weave_kernel.build import CSRC, sources_digest


def test_digest_names_the_sources(tmp_path):
    d = sources_digest()
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", d)
    copy = tmp_path / "csrc"
    shutil.copytree(CSRC, copy)
    assert sources_digest(copy) == d  # where the sources lie does not matter
    (copy / "notes.txt").write_text("not a source")
    (copy / "__pycache__").mkdir()
    assert sources_digest(copy) == d
    f = copy / "wgmma.cuh"
    f.write_text(f.read_text() + "\n")
    assert sources_digest(copy) != d  # one byte of one source does
    f.rename(copy / "wgmma2.cuh")
    assert sources_digest(copy) not in (d, sources_digest(CSRC))


def test_digest_of_an_empty_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no kernel sources"):
        sources_digest(tmp_path)


def test_the_benchmark_records_both_kernels_of_an_ab_run():
    import argparse

    pytest.importorskip("torch")
    from weave_kernel.bench import kernel_sources

    assert kernel_sources(argparse.Namespace(ab_csrc="")) == {"main": sources_digest()}
    assert kernel_sources(argparse.Namespace(ab_csrc=str(CSRC))) == {"main": sources_digest(), "ab": sources_digest()}
