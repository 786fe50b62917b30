"""Model presets: the MoE geometries the toolkit knows by name.

Numbers come from the models' public configs (see docs/models.md); only what the scheduler needs is kept.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelPreset:
    """Geometry of one MoE model's expert layers.

    hidden_size: H, width of a token row.
    expert_ffn_size: I, width of one routed expert's FFN (gate and up are each H x I, down is I x H).
    num_experts: routed experts per MoE layer (E).
    top_k: experts chosen per token (k).
    num_shared_experts: always-on experts; they run locally and take no part in dispatch or combine (the engine
        simulates them as one FFN of width num_shared_experts * I per GPU with SimOptions.shared 'first' or 'last').
    num_moe_layers: number of MoE layers in the model.
    """

    name: str
    hidden_size: int
    expert_ffn_size: int
    num_experts: int
    top_k: int
    num_shared_experts: int
    num_moe_layers: int
    hf_id: str = ""

    def __post_init__(self) -> None:
        for field in ("hidden_size", "expert_ffn_size", "num_experts", "top_k", "num_moe_layers"):
            if getattr(self, field) <= 0:
                raise ValueError(f"model {self.name}: {field} must be positive")
        if self.top_k > self.num_experts:
            raise ValueError(f"model {self.name}: top_k {self.top_k} > num_experts {self.num_experts}")

    @property
    def flops_per_pair(self) -> int:
        """FLOPs of one token through one expert: gate+up 4*H*I plus down 2*H*I."""
        return 6 * self.hidden_size * self.expert_ffn_size

    @property
    def row_bytes(self) -> int:
        """Bytes of one bf16 token row (dispatch and combine payload)."""
        return 2 * self.hidden_size

    @property
    def expert_weight_bytes(self) -> int:
        """bf16 bytes of one routed expert's three matrices."""
        return 2 * 3 * self.hidden_size * self.expert_ffn_size

    @property
    def shared_ffn_size(self) -> int:
        """Is: width of the fused shared expert, num_shared_experts * I (0 without shared experts)."""
        return self.num_shared_experts * self.expert_ffn_size

    def to_dict(self) -> dict:
        return asdict(self)


_PRESETS = [
    # name, H, I, E, k, shared, layers, hf id
    ModelPreset("deepseek-v3", 7168, 2048, 256, 8, 1, 58, "deepseek-ai/DeepSeek-V3"),
    ModelPreset("phi-3.5-moe", 4096, 6400, 16, 2, 0, 32, "microsoft/Phi-3.5-MoE-instruct"),
    ModelPreset("qwen3-30b-a3b", 2048, 768, 128, 8, 0, 48, "Qwen/Qwen3-30B-A3B"),
    ModelPreset("qwen3.5-35b-a3b", 2048, 512, 256, 8, 1, 40, "Qwen/Qwen3.5-35B-A3B"),
    ModelPreset("deepseek-v2-lite", 2048, 1408, 64, 6, 2, 26, "deepseek-ai/DeepSeek-V2-Lite"),
    ModelPreset("deepseek-v2", 5120, 1536, 160, 6, 2, 59, "deepseek-ai/DeepSeek-V2"),
    ModelPreset("gpt-oss-20b", 2880, 2880, 32, 4, 0, 24, "openai/gpt-oss-20b"),
    ModelPreset("olmoe-1b-7b", 2048, 1024, 64, 8, 0, 16, "allenai/OLMoE-1B-7B-0924"),
    ModelPreset("mixtral-8x7b", 4096, 14336, 8, 2, 0, 32, "mistralai/Mixtral-8x7B-v0.1"),
]

PRESETS: dict[str, ModelPreset] = {p.name: p for p in _PRESETS}

#: The six models of the Weave paper's evaluation, in its order.
WEAVE_EVAL_MODELS = (
    "deepseek-v3",
    "phi-3.5-moe",
    "qwen3-30b-a3b",
    "qwen3.5-35b-a3b",
    "deepseek-v2-lite",
    "deepseek-v2",
)


class UnknownModelError(KeyError):
    """An unknown model name (a KeyError whose message prints without KeyError's quotes)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


#: Upper bounds of a spec's values: far above any real MoE layer, low enough that a typo fails at once instead of
#: allocating routing or simulating for minutes.
SPEC_MAX = {"E": 8192, "k": 256, "H": 131072, "I": 131072, "layers": 1024, "shared": 64}

#: Keys of a model spec (`get_model`), in the order of its canonical name, and the preset field each sets.
SPEC_KEYS = {
    "E": "num_experts",
    "k": "top_k",
    "H": "hidden_size",
    "I": "expert_ffn_size",
    "layers": "num_moe_layers",
    "shared": "num_shared_experts",
}
SPEC_HELP = ("BASE:KEY=VALUE:... where BASE is a preset (its geometry with the keys changed) or 'custom' (E, k, H and I required; layers 1 and shared 0 unless given) and the keys are "
             "E (routed experts), k (top-k), H (hidden size), I (expert FFN size), layers (MoE layers), shared "
             "(shared experts: they run locally, outside dispatch and combine; simulated with --shared "
             "first|last, as one FFN of width shared x I per GPU), "
             "e.g. custom:E=64:k=4:H=2048:I=1024:layers=24 or qwen3-30b-a3b:E=256")


def get_model(name: str) -> ModelPreset:
    """The geometry called `name`: a preset, or a spec `BASE:KEY=VALUE:...` (SPEC_HELP).

    A spec's preset is named by its canonical spec (the base, then the given keys in SPEC_KEYS order), so the
    name written into results and trace metadata resolves back to the same geometry anywhere. Unknown preset
    names raise a KeyError listing the known ones; malformed specs or impossible geometries a ValueError.
    """
    name = str(name)
    if name in PRESETS:
        return PRESETS[name]
    base, sep, rest = name.partition(":")
    if not sep:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(PRESETS)}; or a spec such as "
                       f"custom:E=64:k=4:H=2048:I=1024 (`weave-sim models` explains the form)")
    if base != "custom" and base not in PRESETS:
        raise UnknownModelError(f"model spec {name!r}: unknown base {base!r}; use 'custom' or one of {', '.join(PRESETS)}")
    values: dict[str, int] = {}
    for item in rest.split(":"):
        key, eq, value = item.partition("=")
        if not eq or key not in SPEC_KEYS:
            raise ValueError(f"model spec {name!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(SPEC_KEYS)}")
        if key in values:
            raise ValueError(f"model spec {name!r}: {key} given twice")
        if not re.fullmatch(r"0|[1-9][0-9]*", value):
            raise ValueError(f"model spec {name!r}: {key}={value!r} is not a plain decimal integer")
        values[key] = int(value)
        if values[key] > SPEC_MAX[key]:
            raise ValueError(f"model spec {name!r}: {key}={value} is above its limit {SPEC_MAX[key]}")
    if base == "custom":
        missing = [key for key in ("E", "k", "H", "I") if key not in values]
        if missing:
            raise ValueError(f"model spec {name!r}: a custom model needs {', '.join(missing)} too")
        fields = {"num_moe_layers": 1, "num_shared_experts": 0, "hf_id": ""}
    else:
        fields = {**PRESETS[base].to_dict(), "hf_id": ""}
    fields.update({SPEC_KEYS[key]: v for key, v in values.items()})
    canonical = ":".join([base] + [f"{key}={values[key]}" for key in SPEC_KEYS if key in values])
    fields["name"] = canonical
    return ModelPreset(**fields)

