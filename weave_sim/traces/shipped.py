"""The routing data shipped in the repository's top-level `traces/` folder (see traces/README.md, NOTICE)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from weave_sim.traces.format import RoutingTrace, TraceError, load_trace

#: The data folder: the checkout's top-level traces/ (weave_sim/traces/shipped.py -> parents[2] is the repository
#: root; editable installs and source trees), else the copy a wheel installs as weave_sim/_shipped_traces
#: (pyproject.toml maps traces/ there, with its README, NOTICE and license).
_CHECKOUT_TRACES = Path(__file__).resolve().parents[2] / "traces"
_INSTALLED_TRACES = Path(__file__).resolve().parents[1] / "_shipped_traces"
TRACES_DIR = _CHECKOUT_TRACES if (_CHECKOUT_TRACES / "README.md").exists() else _INSTALLED_TRACES

#: 12k decode tokens of complete GPT-OSS-20B requests (traces/make_subset.py builds it).
DEFAULT_TRACE = TRACES_DIR / "gpt-oss-20b-subset.npz"

#: Per-expert selection counts of OLMoE-1B-7B and Mixtral-8x7B (from allenai/OLMoE).
EXPERT_LOAD_FILE = TRACES_DIR / "expert-load-olmoe-mixtral.json"

# The JSON names models by Hugging Face id; the toolkit by preset name.
_PROFILE_MODELS = {"allenai/OLMoE-1B-7B-0924": "olmoe-1b-7b", "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b"}


def _require(path: Path) -> Path:
    if not path.exists():
        raise TraceError(f"shipped data file missing: {path}. It lives in the repository's traces/ folder, which "
                         f"installs as weave_sim/_shipped_traces; reinstall the package (pip install .)")
    return path


def default_trace() -> RoutingTrace:
    """The shipped GPT-OSS-20B subset as a validated RoutingTrace (model gpt-oss-20b)."""
    return load_trace(_require(DEFAULT_TRACE))


@dataclass(frozen=True)
class ExpertLoadProfile:
    """Per-expert selection counts of one model, per text domain, for a few of its layers.

    layer_idx: the model layers the rows describe, e.g. (0, 7, 15).
    counts: domain -> int64 `[len(layer_idx), num_experts]` token-expert pairs per expert
        (each row sums to tokens_per_domain * top_k).
    """

    model: str
    num_experts: int
    top_k: int
    num_model_layers: int
    tokens_per_domain: int
    layer_idx: tuple
    counts: dict

    @property
    def domains(self) -> tuple:
        return tuple(self.counts)

    def total_counts(self) -> np.ndarray:
        """Counts summed over domains: int64 `[len(layer_idx), num_experts]`."""
        return sum(self.counts.values())


def load_expert_load_profiles(path=None) -> dict[str, ExpertLoadProfile]:
    """Read the OLMoE / Mixtral expert-load file: preset name -> ExpertLoadProfile."""
    from weave_sim.presets import get_model

    path = _require(Path(path) if path is not None else EXPERT_LOAD_FILE)
    raw = json.loads(path.read_text())
    layer_idx = tuple(int(v) for v in raw["layers"])
    profiles = {}
    for hf_name, entry in raw["models"].items():
        name = _PROFILE_MODELS.get(hf_name, hf_name)
        counts = {domain: np.asarray(rows, dtype=np.int64) for domain, rows in entry["expert_counts"].items()}
        for domain, rows in counts.items():
            if rows.shape != (len(layer_idx), entry["num_experts"]):
                raise TraceError(f"{path}: {hf_name}/{domain} counts have shape {rows.shape}, expected "
                                 f"{(len(layer_idx), entry['num_experts'])}")
        num_model_layers = get_model(name).num_moe_layers if name in _PROFILE_MODELS.values() else max(layer_idx) + 1
        profiles[name] = ExpertLoadProfile(name, int(entry["num_experts"]), int(entry["top_k"]), num_model_layers,
                                           int(entry["tokens_per_domain"]), layer_idx, counts)
    return profiles
