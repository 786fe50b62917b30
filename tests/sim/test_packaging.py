"""pyproject.toml lists its packages explicitly (traces/ is mapped into weave_sim): the list stays complete."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed():
    pyproject = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'"([\w.]+)"', re.search(r"packages = \[(.*?)\]", pyproject, re.S).group(1)))
    found = {".".join(p.relative_to(ROOT).parts[:-1]) for p in ROOT.glob("weave_*/**/__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert "weave_sim._shipped_traces" in listed
    assert re.search(r'"weave_sim._shipped_traces" = "traces"', pyproject)


def test_shipped_data_files_are_packaged():
    """Every data file weave_sim reads from traces/ matches the package-data patterns of the mapped package."""
    from fnmatch import fnmatch

    from weave_sim.traces import DEFAULT_TRACE, EXPERT_LOAD_FILE

    pyproject = (ROOT / "pyproject.toml").read_text()
    patterns = re.findall(r'"([^"]+)"', re.search(r'"weave_sim._shipped_traces" = \[(.*?)\]', pyproject).group(1))
    for path in (DEFAULT_TRACE, EXPERT_LOAD_FILE, ROOT / "traces" / "NOTICE", ROOT / "traces" / "LICENSE-APACHE-2.0"):
        assert path.exists(), path
        assert any(fnmatch(path.name, pat) for pat in patterns), path.name
