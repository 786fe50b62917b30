"""Plain-text tables and JSON result files shared by the CLI commands."""
from __future__ import annotations

import errno
import json
import os
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


class OutputError(OSError):
    """An output file or folder cannot be written; the message names it and why (the CLI prints it as an error)."""


def _not_a_folder(path: Path, what: str) -> None:
    """OutputError when a folder above `path` exists as something else than a folder (a regular file)."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"cannot write {what} {path}: {os.strerror(errno.ENOTDIR)} ({parent} is a file)")
            return


def check_output_dir(path, what: str = "output folder") -> Path:
    """`path` if it is a folder or can be created as one (nothing in its way), else OutputError: for commands that
    write a folder of results, checked before they compute them."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"cannot write {what} {path}: {os.strerror(errno.ENOTDIR)} (it is a file)")
    _not_a_folder(path, what)
    return path


def check_output_file(path, what: str = "output file") -> Path:
    """`path` unless it is an existing folder or lies below a file (OutputError): checked before a command's work."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {what} {path}: {os.strerror(errno.EISDIR)}")
    _not_a_folder(path, what)
    return path


def write_text(path, text: str, what: str = "output file") -> Path:
    """Write `text` to `path`, creating parent folders; OutputError ("cannot write <what> <path>: <why>") when it
    cannot be written (a folder in its place, no permission, a full disk)."""
    path = check_output_file(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise OutputError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    return path


def write_json(path: Path, payload: dict, what: str = "results") -> Path:
    """Write `payload` (numpy values allowed) as indented JSON, creating parent folders; OutputError when it cannot
    be written."""
    return write_text(path, json.dumps(_jsonable(payload), indent=1), what)
