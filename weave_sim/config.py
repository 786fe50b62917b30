"""The resolved configuration of one run, and the routing it implies.

Every command builds a RunConfig from its flags, resolves it (model, placement, profile, routing) and
writes the resolved configuration next to its results, so a result file says exactly what produced it.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .placement import PLACEMENTS, Placement, balanced_per_layer, make_placement
from .presets import PRESETS, SPEC_HELP, ModelPreset, get_model
from .profile import HardwareProfile, load_profile
from .traces.generators import GENERATORS, MAX_ROUTING_ENTRIES

DEFAULT_MODEL = "gpt-oss-20b"
DEFAULT_OUT = Path("weave-out")


@dataclass(frozen=True)
class RunConfig:
    """What to simulate. `trace` None + `synthetic` set means generated routing; `trace` 'default' is the
    shipped real GPT-OSS-20B subset."""

    model: str | None = None  # None: the trace's model, else DEFAULT_MODEL
    num_gpus: int = 4
    tokens_per_gpu: int = 2048
    trace: str | None = "default"
    synthetic: str = "zipf"
    mode: str = "prefill"
    seed: int = 0
    profile: str = "h200"
    placement: str = "contiguous"
    layers: tuple[int, ...] | None = None
    out: Path = DEFAULT_OUT
    synthetic_params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ValueError("--gpus must be >= 1")
        if self.tokens_per_gpu < 1:
            raise ValueError("--tokens must be >= 1")
        if self.seed < 0:
            raise ValueError("--seed must be >= 0")
        if self.mode not in ("prefill", "decode"):
            raise ValueError("--mode must be prefill or decode")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        return d


@dataclass(frozen=True)
class Resolved:
    config: RunConfig
    model: ModelPreset
    placement: Placement | list[Placement]  # one per selected layer under --placement balanced
    profile: HardwareProfile
    routing: np.ndarray  # int64 [num_gpus * tokens_per_gpu, num_layers_selected, top_k]
    layer_ids: np.ndarray  # which MoE layers `routing` holds
    routing_source: str

    def describe(self) -> dict:
        config = self.config.to_dict()
        config["model"] = self.model.name  # the model run, also where the flag was left to the trace
        if self.config.trace is not None:  # a trace's batch: no generator ran
            config["synthetic"] = None
            config["synthetic_params"] = None
        return {
            **config,
            "model_preset": self.model.to_dict(),
            "placement_owner": (self.placement.owner.tolist() if isinstance(self.placement, Placement)
                                else [p.owner.tolist() for p in self.placement]),  # per layer (balanced)
            "profile_name": self.profile.name,
            "profile_version": self.profile.version,
            "routing_source": self.routing_source,
            "layer_ids": self.layer_ids.tolist(),
        }


#: Most routing entries (tokens x MoE layers x top-k) a run generates or forms: 2 GiB of int64 (MAX_ROUTING_ENTRIES,
#: defined with the generators, which check it too). Most pair counts a run's layer workloads hold (GPUs x GPUs x
#: experts per layer, LayerWorkload.pair_counts, times the layers run): 2 GiB of int64 as well.
MAX_PAIR_COUNT_ENTRIES = 1 << 28


def resolve(cfg: RunConfig) -> Resolved:
    """Load everything a run needs; any inconsistency raises ValueError with a clear message (the cheap checks
    before any routing is generated or formed)."""
    from . import traces

    profile = load_profile(cfg.profile)
    num_tokens = cfg.num_gpus * cfg.tokens_per_gpu
    trace = None
    if cfg.trace is not None:
        trace = traces.load_trace(traces.DEFAULT_TRACE if cfg.trace == "default" else cfg.trace,
                                  model=cfg.model)  # a --model that contradicts the trace is an error
    model = get_model((trace.model if trace is not None else None) or cfg.model or DEFAULT_MODEL)
    placement = make_placement("contiguous" if cfg.placement == "balanced" else cfg.placement, model.num_experts,
                               cfg.num_gpus)  # checks the split; balanced is built from the routing below
    num_layers = model.num_moe_layers
    layer_ids = np.arange(num_layers) if cfg.layers is None else np.asarray(cfg.layers)
    if layer_ids.size == 0 or layer_ids.min() < 0 or layer_ids.max() >= num_layers:
        raise ValueError(f"--layers must lie in [0, {num_layers})")
    pair_entries = cfg.num_gpus * cfg.num_gpus * model.num_experts * layer_ids.size
    if pair_entries > MAX_PAIR_COUNT_ENTRIES:
        raise ValueError(f"--gpus {cfg.num_gpus}: {cfg.num_gpus} x {cfg.num_gpus} GPUs x {model.num_experts} experts x "
                         f"{layer_ids.size} layers is more pair counts than a run holds ({MAX_PAIR_COUNT_ENTRIES} "
                         f"entries): use fewer --gpus, or fewer --layers")
    if num_tokens * num_layers * model.top_k > MAX_ROUTING_ENTRIES:
        raise ValueError(f"{num_tokens} tokens x {num_layers} layers x top-{model.top_k} is more routing than a "
                         f"run holds ({MAX_ROUTING_ENTRIES} entries): use fewer --gpus / --tokens, or a model with "
                         f"fewer layers")
    if trace is not None:
        routing = traces.routing_for(model, num_tokens, trace=trace, mode=cfg.mode, seed=cfg.seed)
        source = f"trace {cfg.trace} ({cfg.mode} batch)"
    else:
        routing = traces.routing_for(
            model, num_tokens, synthetic=cfg.synthetic, mode=cfg.mode, seed=cfg.seed, **cfg.synthetic_params
        )
        source = f"synthetic {cfg.synthetic} seed {cfg.seed}"
    routing = np.asarray(routing)[:, layer_ids, :]
    if cfg.placement == "balanced":
        placement = balanced_per_layer(routing, model.num_experts, cfg.num_gpus)
    return Resolved(cfg, model, placement, profile, routing, layer_ids, source)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by costmodel, simulate and sweep."""
    p.add_argument("--model", default=None,
                   help=f"preset ({', '.join(PRESETS)}) or spec {SPEC_HELP}; default {DEFAULT_MODEL}, or the trace's model")
    p.add_argument("--gpus", type=int, default=4, help="GPUs in the EP group (default 4)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per GPU (default 2048)")
    p.add_argument("--trace", default=None, help="routing trace .npz in the interchange format (traces/README.md)")
    p.add_argument("--synthetic", default=None,
                   help=f"synthetic routing kind ({', '.join(sorted(GENERATORS))}; docs/traces.md)")
    p.add_argument("--mode", default="prefill", choices=["prefill", "decode"], help="batch formation from a trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default="h200", help="hardware profile name or JSON path (default h200)")
    p.add_argument("--placement", default="contiguous", choices=list(PLACEMENTS),
                   help="expert -> GPU map (default contiguous); balanced: per layer, the run's own expert loads spread "
                        "evenly, equal experts per GPU (an upper bound on a placement from past routing statistics)")
    p.add_argument("--layers", default=None, help="comma-separated MoE layer ids (default all)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the JSON results (simulate: also its Chrome trace and plots)")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Embedded default: the shipped real GPT-OSS-20B trace when neither a model, trace nor generator is given."""
    if args.trace is not None:
        trace = args.trace
    elif args.synthetic is None and args.model in (None, DEFAULT_MODEL):
        trace = "default"
    else:
        trace = None
    if args.trace is not None and args.synthetic is not None:
        raise ValueError("give --trace or --synthetic, not both")
    layers = None
    if args.layers:
        try:
            layers = tuple(int(x) for x in args.layers.split(","))
        except ValueError:
            raise ValueError(f"--layers must be comma-separated layer numbers, got {args.layers!r}") from None
        if len(set(layers)) != len(layers):
            raise ValueError(f"--layers names a layer twice: {args.layers}")
    return RunConfig(
        model=args.model, num_gpus=args.gpus, tokens_per_gpu=args.tokens, trace=trace,
        synthetic=args.synthetic or "zipf", mode=args.mode, seed=args.seed, profile=args.profile,
        placement=args.placement, layers=layers, out=args.out,
    )
