"""Seeded routing generators for tests and benchmarks (numpy only).

`skewed_routing` draws k distinct experts per token with probabilities proportional to a Zipf law over a
random permutation of the experts (Gumbel top-k: exact sampling without replacement), so some experts are hot
and some receive nothing. Softmax-like weights that sum to 1 per token.

`RoutingSpec` / `rank_routing`: what the kernel benchmark routes. By default its own Zipf draw per rank
(`bench_routing`); with `--synthetic KIND` or `--routing-trace FILE` the routing of chosen MoE layers of the model,
from weave_sim's generators or a recorded trace (weave_sim.traces.routing_for), so that the kernel is measured on
real or realistically skewed per-layer routing. Results files record the spec; `result_routing` rebuilds any
rank's routing of any result from it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def skewed_routing(num_tokens: int, num_experts: int, top_k: int, *, seed: int, zipf_s: float = 1.0
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Return (topk_ids int32 [N, k], topk_weights float32 [N, k]); ids distinct within each row."""
    if top_k > num_experts:
        raise ValueError(f"top_k {top_k} > num_experts {num_experts}")
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, num_experts + 1) ** zipf_s
    log_p = np.log(popularity[rng.permutation(num_experts)])
    scores = log_p[None, :] + rng.gumbel(size=(num_tokens, num_experts))
    ids = np.argpartition(-scores, top_k - 1, axis=1)[:, :top_k].astype(np.int32)
    logits = rng.normal(size=(num_tokens, top_k))
    w = np.exp(logits - logits.max(1, keepdims=True))
    return ids, (w / w.sum(1, keepdims=True)).astype(np.float32)


def bench_routing(num_tokens: int, num_experts: int, top_k: int, *, seed: int, rank: int, zipf_s: float = 1.0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The routing `python -m weave_kernel.bench` gives rank `rank` at `num_tokens` tokens per GPU (its --seed and
    --zipf): recount and whatif rebuild a benchmark's layers from this."""
    return skewed_routing(num_tokens, num_experts, top_k, seed=seed * 100003 + rank * 7 + num_tokens, zipf_s=zipf_s)


def single_expert_routing(num_tokens: int, top_k: int, expert: int, num_experts: int, *, seed: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Every token's first choice is `expert`; the other k-1 are distinct random experts (worst-case skew)."""
    rng = np.random.default_rng(seed)
    ids = np.empty((num_tokens, top_k), dtype=np.int32)
    ids[:, 0] = expert
    others = np.array([e for e in range(num_experts) if e != expert])
    for t in range(num_tokens):
        ids[t, 1:] = rng.choice(others, size=top_k - 1, replace=False)
    w = rng.random((num_tokens, top_k)).astype(np.float32) + 0.1
    return ids, (w / w.sum(1, keepdims=True)).astype(np.float32)


# ---- what the benchmark routes: its own Zipf draw, a weave_sim generator, or a recorded trace ----------------
ROUTING_SOURCES = ("zipf", "synthetic", "trace")
_WEIGHT_SEED = 7919  # mixed into the gate weights' seed of generated / traced routing (ids come from weave_sim)


@dataclass(frozen=True)
class RoutingSpec:
    """Where the benchmark's routing comes from; recorded in a results file's config as "routing" so that recount,
    whatif, predict and validate rebuild exactly the layers that ran.

    zipf:      `bench_routing` (one independent Gumbel top-k Zipf draw per rank; no layers), exponent `zipf_s`.
    synthetic: weave_sim's generator `kind` with `params`, for the model's geometry and all its MoE layers; the
               world's tokens are drawn as one batch (seeded by the bench's seed and the tokens per GPU), rank r
               takes tokens [r n, (r + 1) n) of the chosen layer.
    trace:     a recorded trace of this model (`path`, or "default" for the shipped GPT-OSS-20B subset), a batch
               formed from it in `mode` (prefill / decode) as weave_sim.traces.routing_for does; ranks as above.
    """

    source: str = "zipf"
    zipf_s: float = 1.0
    kind: str = ""
    params: dict = field(default_factory=dict)
    path: str = ""
    mode: str = "prefill"

    def __post_init__(self):
        from weave_sim.traces import GENERATORS
        from weave_sim.traces.batches import BATCH_MODES

        if self.source not in ROUTING_SOURCES:
            raise ValueError(f"routing source must be one of {ROUTING_SOURCES}, got {self.source!r}")
        if self.source == "synthetic" and self.kind not in GENERATORS:
            raise ValueError(f"unknown synthetic routing {self.kind!r}; one of {sorted(GENERATORS)}")
        if self.source == "trace" and not self.path:
            raise ValueError("trace routing needs a trace file (or 'default')")
        if self.mode not in BATCH_MODES:
            raise ValueError(f"mode must be one of {BATCH_MODES}, got {self.mode!r}")
        if self.params and self.source != "synthetic":
            raise ValueError("generator parameters go with --synthetic only")
        if not self.zipf_s >= 0:
            raise ValueError(f"zipf exponent must be >= 0, got {self.zipf_s}")

    @property
    def per_layer(self) -> bool:
        """True when the routing has MoE layers to choose from (synthetic, trace)."""
        return self.source != "zipf"

    def trace_file(self) -> Path:
        from weave_sim.traces import DEFAULT_TRACE

        return Path(DEFAULT_TRACE) if self.path == "default" else Path(self.path)

    def to_dict(self) -> dict:
        d = {"source": self.source}
        if self.source == "zipf":
            d["zipf"] = self.zipf_s
        elif self.source == "synthetic":
            d.update(kind=self.kind, params=dict(self.params), mode=self.mode)
        else:
            f = self.trace_file()
            d.update(trace=self.path, mode=self.mode,
                     trace_sha256=hashlib.sha256(f.read_bytes()).hexdigest()[:16] if f.exists() else None)
        return d

    def describe(self) -> str:
        if self.source == "zipf":
            return f"Zipf {self.zipf_s} per rank"
        if self.source == "synthetic":
            p = ",".join(f"{k}={v}" for k, v in self.params.items())
            return f"synthetic {self.kind}{f' ({p})' if p else ''}, {self.mode} batch, per layer"
        return f"trace {self.path} ({self.mode} batch), per layer"


def spec_of_config(cfg: dict) -> RoutingSpec:
    """The routing of a results file from its config ("routing"; files before it: Zipf with their "zipf")."""
    d = cfg.get("routing")
    if not isinstance(d, dict):
        return RoutingSpec("zipf", zipf_s=float(cfg.get("zipf", 1.0)))
    if d["source"] == "zipf":
        return RoutingSpec("zipf", zipf_s=float(d.get("zipf", 1.0)))
    if d["source"] == "synthetic":
        return RoutingSpec("synthetic", kind=d["kind"], params=dict(d.get("params") or {}), mode=d.get("mode", "prefill"))
    spec = RoutingSpec("trace", path=d["trace"], mode=d.get("mode", "prefill"))
    want = d.get("trace_sha256")
    have = spec.to_dict()["trace_sha256"]
    if want and have != want:
        raise ValueError(f"routing trace {spec.trace_file()} is not the file the benchmark used "
                         f"(sha256 {have} != {want})" if have else f"routing trace {spec.trace_file()} not found")
    return spec


def default_layers(spec: RoutingSpec, num_layers: int) -> list:
    """The MoE layers a benchmark times when --layers is not given: none to choose for zipf ([None]), else four
    spread over the depth (first, about a third, about two thirds, last)."""
    if not spec.per_layer:
        return [None]
    return sorted({int(round(x)) for x in np.linspace(0, num_layers - 1, min(4, num_layers))})


def parse_layers(text: str, spec: RoutingSpec, num_layers: int) -> list:
    """--layers: "" (default_layers), "all", or comma-separated MoE layer indices in [0, num_layers)."""
    if not text:
        return default_layers(spec, num_layers)
    if not spec.per_layer:
        raise ValueError("--layers needs per-layer routing (--synthetic or --routing-trace); the default Zipf draw "
                         "has no layers")
    if text == "all":
        return list(range(num_layers))
    try:
        layers = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise ValueError(f"--layers must be 'all' or comma-separated MoE layer numbers, got {text!r}") from None
    bad = [x for x in layers if not 0 <= x < num_layers]
    if bad or not layers:
        raise ValueError(f"--layers {text!r}: MoE layers lie in [0, {num_layers})")
    return layers


@functools.lru_cache(maxsize=2)
def _batch_ids(spec_key: str, model, total_tokens: int, seed: int) -> np.ndarray:
    """[total_tokens, layers, k] int64 ids of one batch over all ranks (weave_sim.traces.routing_for)."""
    from weave_sim.traces import routing_for

    spec = RoutingSpec(**json.loads(spec_key))
    if spec.source == "synthetic":
        return routing_for(model, total_tokens, synthetic=spec.kind, mode=spec.mode, seed=seed, **spec.params)
    return routing_for(model, total_tokens, trace=spec.trace_file(), mode=spec.mode, seed=seed)


def rank_routing(spec: RoutingSpec, model, world: int, num_tokens: int, *, seed: int, rank: int,
                 layer: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(topk_ids int32 [n, k], topk_weights float32 [n, k]) of rank `rank` at `num_tokens` tokens per GPU, MoE layer
    `layer` (None with zipf) of `model` (a weave_sim ModelPreset): what `python -m weave_kernel.bench` runs."""
    if not spec.per_layer:
        if layer is not None:
            raise ValueError("Zipf routing has no layers")
        return bench_routing(num_tokens, model.num_experts, model.top_k, seed=seed, rank=rank, zipf_s=spec.zipf_s)
    if layer is None or not 0 <= layer < model.num_moe_layers:
        raise ValueError(f"MoE layer {layer} of {model.name}: must lie in [0, {model.num_moe_layers})")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world {world}")
    key = json.dumps({"source": spec.source, "kind": spec.kind, "params": spec.params, "path": spec.path,
                      "mode": spec.mode}, sort_keys=True)
    ids = _batch_ids(key, model, world * num_tokens, seed * 100003 + num_tokens)
    if ids.shape[2] != model.top_k or ids.max() >= model.num_experts:
        raise ValueError(f"{spec.describe()}: its top-{ids.shape[2]} over {int(ids.max()) + 1}+ experts does not fit "
                         f"{model.name} as run (top-{model.top_k} of {model.num_experts} experts)")
    ids = np.ascontiguousarray(ids[rank * num_tokens:(rank + 1) * num_tokens, layer, :], dtype=np.int32)
    rng = np.random.default_rng([seed, rank, num_tokens, layer, _WEIGHT_SEED])
    logits = rng.normal(size=ids.shape)
    w = np.exp(logits - logits.max(1, keepdims=True))
    return ids, (w / w.sum(1, keepdims=True)).astype(np.float32)


def result_model(result: dict):
    """The weave_sim ModelPreset a benchmark result ran (its preset, with the result's experts / top-k, which
    --max-local-experts may have cut)."""
    from weave_sim.presets import get_model

    m = get_model(result["model"])
    return dataclasses.replace(m, num_experts=int(result["experts"]), top_k=int(result["top_k"]))


def result_routing(cfg: dict, result: dict, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """rank_routing of one result of a results file whose config is `cfg`."""
    spec, seed = spec_of_config(cfg), int(cfg.get("seed", 0))
    if not spec.per_layer:  # needs only the geometry (results of models that are not presets included)
        return bench_routing(int(result["tokens_per_gpu"]), int(result["experts"]), int(result["top_k"]), seed=seed,
                             rank=rank, zipf_s=spec.zipf_s)
    return rank_routing(spec, result_model(result), int(result["gpus"]), int(result["tokens_per_gpu"]), seed=seed,
                        rank=rank, layer=result.get("layer"))


def add_routing_args(ap) -> None:
    """The routing options of `python -m weave_kernel.bench` (and of predict, which rebuilds the bench's routing)."""
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the default per-rank routing draw")
    ap.add_argument("--synthetic", default=None,
                    help="route by weave_sim's generator KIND (uniform, zipf, dirichlet, drifting, load_profile, "
                         "fitted) per MoE layer instead of the per-rank Zipf draw")
    ap.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                    help="a --synthetic generator parameter (repeatable; JSON values)")
    ap.add_argument("--routing-trace", default=None, metavar="FILE",
                    help="route by a recorded trace of the model ('default' = the shipped GPT-OSS-20B subset)")
    ap.add_argument("--mode", default="prefill", choices=("prefill", "decode"),
                    help="how a batch is formed from --synthetic fitted / --routing-trace routing")
    ap.add_argument("--layers", default="",
                    help="MoE layers to run with --synthetic / --routing-trace: comma-separated, 'all', or '' "
                         "(four spread over the depth)")


def spec_from_args(args) -> RoutingSpec:
    """The RoutingSpec of add_routing_args' options; ValueError on a bad combination or a missing trace file."""
    from weave_sim.traces.cli import parse_params

    if (args.synthetic or args.routing_trace) and args.zipf != 1.0:
        raise ValueError("--zipf sets the default per-rank draw; it does not combine with --synthetic / --routing-trace")
    if args.synthetic and args.routing_trace:
        raise ValueError("give --synthetic or --routing-trace, not both")
    params = parse_params(args.param)
    if params and not args.synthetic:
        raise ValueError("generator parameters (-p) go with --synthetic only")
    if args.synthetic:
        spec = RoutingSpec("synthetic", kind=args.synthetic, params=params, mode=args.mode)
    elif args.routing_trace:
        spec = RoutingSpec("trace", path=args.routing_trace, mode=args.mode)
    else:
        spec = RoutingSpec("zipf", zipf_s=args.zipf)
    if spec.source == "trace" and not spec.trace_file().exists():
        raise ValueError(f"routing trace {spec.trace_file()} not found")
    return spec
