"""docs/usage.md's CPU snippet runs as written (so the page stays true), and gives the block's shape back."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def test_the_cpu_snippet_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    snippet = next(b for b in blocks if 'backend="torch"' in b)
    scope: dict = {}
    exec(compile(snippet, str(DOC), "exec"), scope)  # noqa: S102 - the doc's own example
    x_shape = (3, 5, scope["H"])
    assert tuple(scope["y"].shape) == x_shape and scope["y"].dtype == torch.bfloat16
    assert torch.isfinite(scope["y"].float()).all() and scope["y"].float().abs().sum() > 0
