"""Plain-text tables and JSON result files shared by the CLI commands."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def format_table(headers: list[str], rows: list[list], title: str = "") -> str:
    """Right-aligned fixed-width table; floats print with 3 significant decimals."""
    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return f"{v:.3f}" if abs(v) < 1e4 else f"{v:.3g}"
        return str(v)

    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = [title] if title else []
    lines.append("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in body)
    return "\n".join(lines)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json(path: Path, payload: dict) -> Path:
    """Write `payload` (numpy values allowed) as indented JSON, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(payload), indent=1))
    return path

