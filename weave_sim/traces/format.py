"""The routing-trace interchange format: one `.npz`, defined here and in traces/README.md.

Keys (anything else in the file is ignored):
  topk_ids    integer (any width, signed or unsigned) [num_tokens, num_layers, top_k]   required
  topk_probs  floating [num_tokens, num_layers, top_k], finite and >= 0                  optional
  request_id  integer [num_tokens]                                                       optional
  position    integer [num_tokens]                                                       optional
  metadata    0-d string holding a JSON object: "model" (preset name or HF id),
              "source", "license", anything else kept as is                              optional

`load_trace` validates the whole file against the model preset before it returns, so a trace either
loads completely or raises `TraceError` naming the problem.
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from weave_sim.presets import PRESETS, ModelPreset, get_model
from weave_sim.report import OutputError, check_output_file

#: Keys of the interchange format; everything else in an npz is ignored on load.
TRACE_KEYS = ("topk_ids", "topk_probs", "request_id", "position", "metadata")
#: What reading a damaged npz member can raise: a bad zip structure or CRC (BadZipFile), a damaged deflate stream
#: (zlib.error), a truncated or malformed array (ValueError, EOFError, OSError).
NPZ_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError)


class TraceError(ValueError):
    """A routing trace is malformed or does not fit its model; the message names the problem."""


@dataclass(frozen=True)
class RoutingTrace:
    """Expert choices of a sequence of tokens through every MoE layer of one model.

    topk_ids: int64 `[num_tokens, num_layers, top_k]`, the experts each token picked in each layer,
        distinct within a token's top-k (in a recorded trace, ordered by descending gate probability).
    topk_probs: float32, same shape, or None: the gate probabilities of those experts.
    request_id: int64 `[num_tokens]` or None: the request a token belongs to. None means one stream.
    position: int64 `[num_tokens]` or None: the token's position in its sequence.
    metadata: JSON-able dict; "model" is the preset name when known.

    The constructor converts dtypes and checks shapes; checks against a model (expert range,
    duplicates, layer count) are in `validate_trace`.
    """

    topk_ids: np.ndarray
    topk_probs: np.ndarray | None = None
    request_id: np.ndarray | None = None
    position: np.ndarray | None = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = np.asarray(self.topk_ids)
        if ids.ndim != 3:
            raise TraceError(f"topk_ids must have rank 3 [num_tokens, num_layers, top_k], got shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise TraceError(f"topk_ids must be an integer array, got dtype {ids.dtype}")
        _check_int64_range("topk_ids", ids)
        object.__setattr__(self, "topk_ids", ids.astype(np.int64, copy=False))
        if self.topk_probs is not None:
            probs = np.asarray(self.topk_probs)
            if probs.shape != ids.shape:
                raise TraceError(f"topk_probs shape {probs.shape} does not match topk_ids shape {ids.shape}")
            if not np.issubdtype(probs.dtype, np.floating):
                raise TraceError(f"topk_probs must be floating point, got dtype {probs.dtype}")
            object.__setattr__(self, "topk_probs", probs.astype(np.float32, copy=False))
        for name in ("request_id", "position"):
            value = getattr(self, name)
            if value is None:
                continue
            arr = np.asarray(value)
            if arr.ndim != 1 or arr.shape[0] != ids.shape[0]:
                raise TraceError(f"{name} must have shape [{ids.shape[0]}] (one per token), got {arr.shape}")
            if not np.issubdtype(arr.dtype, np.integer):
                raise TraceError(f"{name} must be an integer array, got dtype {arr.dtype}")
            _check_int64_range(name, arr)
            object.__setattr__(self, name, arr.astype(np.int64, copy=False))
        if not isinstance(self.metadata, dict):
            raise TraceError(f"metadata must be a dict, got {type(self.metadata).__name__}")

    @property
    def num_tokens(self) -> int:
        return int(self.topk_ids.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.topk_ids.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[2])

    @property
    def model(self) -> str | None:
        return self.metadata.get("model")

    def select(self, token_idx: np.ndarray) -> "RoutingTrace":
        """The tokens at `token_idx` (int `[n]`, in that order) as a new trace with the same metadata."""
        pick = lambda a: None if a is None else a[token_idx]  # noqa: E731
        return RoutingTrace(self.topk_ids[token_idx], pick(self.topk_probs), pick(self.request_id),
                            pick(self.position), dict(self.metadata))

    def with_metadata(self, **updates) -> "RoutingTrace":
        """The same arrays with metadata entries added or replaced."""
        return RoutingTrace(self.topk_ids, self.topk_probs, self.request_id, self.position,
                            {**self.metadata, **updates})


def resolve_model(name: str, where: str = "") -> ModelPreset:
    """The preset for a preset name, its Hugging Face id or a model spec (presets.get_model); unknown names and
    bad specs raise TraceError."""
    for preset in PRESETS.values():
        if preset.hf_id and preset.hf_id.lower() == str(name).lower():
            return preset
    try:
        return get_model(name)
    except (KeyError, ValueError) as exc:
        raise TraceError(f"{where}{exc.args[0] if exc.args else exc}") from None


def _check_int64_range(name: str, arr: np.ndarray) -> None:
    """Unsigned values above int64's range would wrap to negative numbers when stored as int64."""
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise TraceError(f"{name} holds {int(arr.max())}, beyond the int64 range a trace stores")


def validate_trace(trace: RoutingTrace, preset: ModelPreset, where: str = "") -> None:
    """Raise TraceError unless `trace` fits `preset`: token count >= 1, top_k and layer count equal to
    the model's, expert ids in [0, num_experts), no expert twice in a token's top-k, probabilities
    finite and non-negative."""
    ids = trace.topk_ids
    if trace.num_tokens == 0:
        raise TraceError(f"{where}empty trace: topk_ids has no tokens")
    if trace.top_k != preset.top_k:
        raise TraceError(f"{where}top_k {trace.top_k} does not match {preset.name} (top_k {preset.top_k})")
    if trace.num_layers != preset.num_moe_layers:
        raise TraceError(f"{where}layer count {trace.num_layers} does not match {preset.name} "
                         f"({preset.num_moe_layers} MoE layers)")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= preset.num_experts:
        bad = low if low < 0 else high
        token = int(np.argwhere((ids < 0) | (ids >= preset.num_experts))[0][0])
        raise TraceError(f"{where}expert id {bad} out of range [0, {preset.num_experts}) for {preset.name} "
                         f"(first at token {token})")
    if trace.top_k > 1:
        ordered = np.sort(ids, axis=2)
        dup = np.diff(ordered, axis=2) == 0
        if dup.any():
            token, layer, _ = (int(v) for v in np.argwhere(dup)[0])
            raise TraceError(f"{where}duplicate expert in a token's top-k: token {token}, layer {layer} "
                             f"has {ids[token, layer].tolist()}")
    if trace.topk_probs is not None:
        probs = trace.topk_probs
        if not np.all(np.isfinite(probs)):
            raise TraceError(f"{where}topk_probs contains NaN or infinite values")
        if np.any(probs < 0):
            raise TraceError(f"{where}topk_probs contains negative values")


def open_numpy_file(path: Path, what: str = "trace file", formats: str = "npz file"):
    """np.load of an existing, non-empty file without pickles (an NpzFile or an ndarray); every failure is a
    TraceError naming the file."""
    if not path.exists():
        raise TraceError(f"{what} not found: {path}")
    if path.is_dir():
        raise TraceError(f"{what} is a directory, not a file: {path}")
    if path.stat().st_size == 0:
        raise TraceError(f"{path}: empty file")
    with open(path, "rb") as f:
        head = f.read(6)
    if not (head.startswith(b"PK") or head == b"\x93NUMPY"):  # a zip (npz) or an .npy array; numpy would call
        raise TraceError(f"{path}: not in numpy's npz or .npy format (expected: {formats})")  # else: "a pickle"
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise TraceError(f"{path}: not a readable {formats} ({exc})") from None


def _read_npz(path: Path) -> dict:
    """Every interchange key present in the file, fully read into memory (so nothing is lazy)."""
    data = open_numpy_file(path)
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise TraceError(f"{path}: a .npy array, not an npz trace; convert it with "
                         f"`weave-sim trace convert {path} -o OUT.npz --model M`")
    try:
        with data:
            return {key: data[key] for key in TRACE_KEYS if key in data.files}
    except NPZ_READ_ERRORS as exc:
        # e.g. an object array (would need unpickling) or a corrupt member
        raise TraceError(f"{path}: not a readable npz file ({exc})") from None


def parse_metadata(raw, where: str) -> dict:
    """Decode the metadata entry: a 0-d string (or bytes) array holding a JSON object."""
    if raw is None:
        return {}
    value = raw.item() if isinstance(raw, np.ndarray) and raw.ndim == 0 else raw
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise TraceError(f"{where}metadata must be a JSON string, got an array of dtype "
                         f"{getattr(raw, 'dtype', type(raw).__name__)}")
    try:
        meta = json.loads(value)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{where}metadata must be a JSON object, got {type(meta).__name__}")
    if "model" in meta and not isinstance(meta["model"], str):
        raise TraceError(f"{where}metadata 'model' must be a string, got {meta['model']!r}")
    return meta


def choose_model(meta_model: str | None, model: str | None, where: str = "") -> ModelPreset:
    """Decide the trace's model: the `model` argument and the metadata must agree when both are given;
    either alone is used; neither is an error."""
    if model is None and meta_model is None:
        raise TraceError(f"{where}no model: the metadata has no 'model'; pass model=... (--model)")
    if model is None:
        return resolve_model(meta_model, f"{where}metadata: ")
    chosen = resolve_model(model)
    if meta_model is not None:
        recorded = resolve_model(meta_model, f"{where}metadata: ")
        if recorded.name != chosen.name:
            raise TraceError(f"{where}model mismatch: the trace metadata says {meta_model!r} "
                             f"but model {model!r} was requested")
    return chosen


def load_trace(path, model: str | None = None) -> RoutingTrace:
    """Load and fully validate an interchange-format trace.

    path: the `.npz` file. model: a preset name; when the file's metadata also names one they must be
    the same model (no silent override), and one of the two must be present.
    Returns a RoutingTrace with int64 ids, float32 probs, int64 request_id/position, and
    metadata["model"] set to the preset name. Raises TraceError on any problem, before returning.
    """
    path = Path(path)
    where = f"{path}: "
    arrays = _read_npz(path)
    if "topk_ids" not in arrays:
        raise TraceError(f"{where}missing required key 'topk_ids' (keys: {sorted(arrays)})")
    meta = parse_metadata(arrays.get("metadata"), where)
    preset = choose_model(meta.get("model"), model, where)
    try:
        trace = RoutingTrace(arrays["topk_ids"], arrays.get("topk_probs"), arrays.get("request_id"),
                             arrays.get("position"), {**meta, "model": preset.name})
    except TraceError as exc:
        raise TraceError(f"{where}{exc}") from None
    validate_trace(trace, preset, where)
    return trace


def _smallest_int(values: np.ndarray, candidates=(np.int8, np.int16, np.int32, np.int64)) -> np.dtype:
    low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
    for dtype in candidates:
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def save_trace(path, trace: RoutingTrace) -> Path:
    """Write `trace` in the interchange format (np.savez_compressed); lossless for `load_trace`.

    Integers are stored at the smallest width that holds them; probabilities as float16 when that is
    exact, else float32. A trace whose metadata names a model is validated against it first, so a file
    that would not load is never written. Returns the path written; report.OutputError (naming `path`) when it
    cannot be written, e.g. a folder is in its place.
    """
    path = check_output_file(Path(path), "trace file")
    if trace.model is not None:
        validate_trace(trace, resolve_model(trace.model), f"{path}: ")
    arrays = {"topk_ids": trace.topk_ids.astype(_smallest_int(trace.topk_ids))}
    if trace.topk_probs is not None:
        half = trace.topk_probs.astype(np.float16)
        exact = np.array_equal(half.astype(np.float32), trace.topk_probs)
        arrays["topk_probs"] = half if exact else trace.topk_probs
    for name in ("request_id", "position"):
        value = getattr(trace, name)
        if value is not None:
            arrays[name] = value.astype(_smallest_int(value, (np.int32, np.int64)))
    arrays["metadata"] = np.array(json.dumps(trace.metadata, sort_keys=True))
    # Write beside the target and rename, so a failed write never leaves a truncated trace behind.
    # A file handle (not a name) also stops numpy from appending ".npz" to other suffixes.
    tmp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp_path, "wb") as fh:
            np.savez_compressed(fh, **arrays)
        os.replace(tmp_path, path)
    except OSError as exc:
        _remove(tmp_path)
        raise OutputError(f"cannot write trace file {path}: {exc.strerror or exc}") from None
    except BaseException:
        _remove(tmp_path)
        raise
    return path


def _remove(path: Path) -> None:
    """Delete a temporary file if it is there (a failed clean-up must not hide the error that caused it)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
