"""Reading a JSON file the toolkit was given (a hardware profile, calibration measurements, kernel benchmark
results, a Chrome trace) with an error that names the file and what it should have been, instead of a decoder's
message: missing or unreadable, not text (e.g. a PNG passed by mistake), or not valid JSON."""
from __future__ import annotations

import json
import math
from pathlib import Path


def read_json(path, what: str, error: type[Exception] = ValueError):
    """The parsed content of `path`; `error` ("cannot read <what> <path>: ...") when it cannot be read or parsed."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        raise error(f"cannot read {what} {path}: not a text (JSON) file") from None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"cannot read {what} {path}: not valid JSON ({exc})") from None


def is_number(value) -> bool:
    """A finite JSON number: an int or a float, not a bool, not NaN or infinite (what a field of a file the toolkit
    reads must be before it is compared or computed with)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
