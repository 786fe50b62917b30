"""Expert-parallel workload of one MoE layer: who sends what to whom, and how much each GPU computes.

Conventions. A batch of N tokens is split evenly over G GPUs in order (GPU g owns a contiguous slice of
tokens, sizes differing by at most one). A (token, expert) pair is computed on the expert's owner.
Dispatch sends a token row once per destination GPU, however many of its experts live there; combine
returns one row per pair. Rows are bf16, so a row is 2*H bytes. Local pairs move no bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .placement import Placement, placement_for
from .presets import ModelPreset

EXPERT_DTYPES = ("bf16", "fp8")  # what an expert weight and a dispatched row element cost in bytes (expert_bytes)


def expert_bytes(expert_dtype: str, hidden: int) -> tuple[int, float]:
    """(bytes of one dispatched row of `hidden` elements, bytes per expert weight element) for experts of this dtype:
    bf16 2 H and 2; fp8 (the megakernel's e4m3 with 128 x 128 block scales, weave_kernel/fp8.py) H plus one fp32
    scale per 128 row elements, and 1 plus one fp32 scale per 128 x 128 weights. Combine rows stay bf16 either way."""
    if expert_dtype not in EXPERT_DTYPES:
        raise ValueError(f"expert_dtype must be one of {EXPERT_DTYPES}, got {expert_dtype!r}")
    if expert_dtype == "fp8":
        return hidden + 4 * -(-hidden // 128), 1.0 + 4.0 / (128 * 128)
    return 2 * hidden, 2.0


@dataclass(frozen=True, eq=False)
class LayerWorkload:
    """Volumes of one MoE layer on G GPUs.

    pair_counts: int64 [G_src, G_dst, E]; token-expert pairs whose token lives on src and whose expert e
        lives on dst (zero wherever dst is not e's owner).
    dispatch_rows: int64 [G_src, G_dst]; distinct tokens of src with at least one expert on dst (the
        diagonal counts tokens that need a local expert; they are not transferred).
    tokens_per_gpu: int64 [G]; tokens owned by each GPU.
    """

    model: ModelPreset
    placement: Placement
    pair_counts: np.ndarray
    dispatch_rows: np.ndarray
    tokens_per_gpu: np.ndarray

    @property
    def num_gpus(self) -> int:
        return self.placement.num_gpus

    # --- pairs --------------------------------------------------------------------------------
    @cached_property
    def computed_pairs(self) -> np.ndarray:
        """int64 [G]: pairs computed on each GPU (local + incoming)."""
        return self.pair_counts.sum(axis=(0, 2))

    @cached_property
    def local_pairs(self) -> np.ndarray:
        """int64 [G]: pairs whose token and expert are on the same GPU."""
        g = np.arange(self.num_gpus)
        return self.pair_counts[g, g].sum(axis=1)

    @property
    def incoming_pairs(self) -> np.ndarray:
        """int64 [G]: pairs computed here for tokens of other GPUs (X_in)."""
        return self.computed_pairs - self.local_pairs

    @property
    def outgoing_pairs(self) -> np.ndarray:
        """int64 [G]: pairs of this GPU's tokens computed elsewhere."""
        return self.pair_counts.sum(axis=(1, 2)) - self.local_pairs

    @cached_property
    def expert_rows(self) -> np.ndarray:
        """int64 [E]: rows (pairs) routed to each expert, from all GPUs."""
        return self.pair_counts.sum(axis=(0, 1))

    def local_expert_rows(self, gpu: int) -> np.ndarray:
        """int64 [experts on gpu]: rows each local expert computes, in local-id order."""
        return self.expert_rows[self.placement.local_experts(gpu)]

    # --- rows and bytes -----------------------------------------------------------------------
    @cached_property
    def dispatch_rows_in(self) -> np.ndarray:
        """int64 [G]: de-duplicated token rows received in dispatch (X_in_uniq)."""
        return self.dispatch_rows.sum(axis=0) - np.diag(self.dispatch_rows)

    @cached_property
    def dispatch_rows_out(self) -> np.ndarray:
        """int64 [G]: de-duplicated token rows sent in dispatch."""
        return self.dispatch_rows.sum(axis=1) - np.diag(self.dispatch_rows)

    @property
    def combine_rows_out(self) -> np.ndarray:
        """int64 [G]: result rows sent back to their tokens' GPUs (one per incoming pair)."""
        return self.incoming_pairs

    @property
    def combine_rows_in(self) -> np.ndarray:
        """int64 [G]: result rows received for this GPU's tokens from other GPUs."""
        return self.outgoing_pairs

    @property
    def dispatch_bytes_in(self) -> np.ndarray:
        return self.dispatch_rows_in * self.model.row_bytes

    @property
    def dispatch_bytes_out(self) -> np.ndarray:
        return self.dispatch_rows_out * self.model.row_bytes

    @property
    def combine_bytes_in(self) -> np.ndarray:
        return self.combine_rows_in * self.model.row_bytes

    @property
    def combine_bytes_out(self) -> np.ndarray:
        return self.combine_rows_out * self.model.row_bytes

    # --- compute ------------------------------------------------------------------------------
    @property
    def flops(self) -> np.ndarray:
        """int64 [G]: expert FFN FLOPs per GPU, 6*H*I per pair."""
        return self.computed_pairs * self.model.flops_per_pair

    @cached_property
    def active_local_experts(self) -> np.ndarray:
        """int64 [G]: local experts with at least one row (only their weights are read)."""
        active = self.expert_rows > 0
        return np.bincount(self.placement.owner[active], minlength=self.num_gpus)

    @property
    def weight_bytes(self) -> np.ndarray:
        """int64 [G]: bf16 weight bytes of the active local experts."""
        return self.active_local_experts * self.model.expert_weight_bytes

    @property
    def shared_flops(self) -> np.ndarray:
        """int64 [G]: FLOPs of the shared experts (one FFN of width Is = shared x I) on each GPU's own tokens,
        6*H*Is per token (0 without shared experts). Not in `flops`: only simulated with SimOptions.shared."""
        return self.tokens_per_gpu * (6 * self.model.hidden_size * self.model.shared_ffn_size)

    @property
    def shared_weight_bytes(self) -> np.ndarray:
        """int64 [G]: bf16 bytes of the shared experts' three matrices, read by every GPU with tokens."""
        return np.where(self.tokens_per_gpu > 0, 2 * 3 * self.model.hidden_size * self.model.shared_ffn_size, 0)

    def gemm_tiles(self, tile_rows: int, tile_cols: int) -> np.ndarray:
        """int64 [G]: output tiles of GEMM0 (I columns after SwiGLU) plus GEMM1 (H columns) per GPU."""
        row_blocks = -(-self.expert_rows // tile_rows)
        blocks = np.bincount(self.placement.owner, weights=row_blocks, minlength=self.num_gpus)
        cols = -(-self.model.expert_ffn_size // tile_cols) + -(-self.model.hidden_size // tile_cols)
        return blocks.astype(np.int64) * cols

    def summary(self) -> dict:
        """Per-GPU volumes as plain lists (for JSON output)."""
        return {
            "tokens": self.tokens_per_gpu.tolist(),
            "local_pairs": self.local_pairs.tolist(),
            "incoming_pairs": self.incoming_pairs.tolist(),
            "dispatch_rows_in": self.dispatch_rows_in.tolist(),
            "dispatch_rows_out": self.dispatch_rows_out.tolist(),
            "combine_rows_out": self.combine_rows_out.tolist(),
            "flops": self.flops.tolist(),
            "weight_bytes": self.weight_bytes.tolist(),
        }


def split_tokens(num_tokens: int, num_gpus: int) -> np.ndarray:
    """int64 [num_tokens]: source GPU of each token, contiguous slices differing by at most one token."""
    return (np.arange(num_tokens, dtype=np.int64) * num_gpus) // max(num_tokens, 1)


def layer_workload(topk_ids, model: ModelPreset, placement: Placement) -> LayerWorkload:
    """Volumes of one layer from its routing.

    topk_ids: integer [num_tokens, top_k], expert ids in [0, E); tokens are split evenly over GPUs.
    """
    ids = np.asarray(topk_ids)
    if ids.ndim != 2 or ids.shape[1] != model.top_k:
        raise ValueError(f"topk_ids must be [num_tokens, {model.top_k}], got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"topk_ids must be integer, got {ids.dtype}")
    if placement.num_experts != model.num_experts:
        raise ValueError(f"placement has {placement.num_experts} experts, {model.name} has {model.num_experts}")
    if ids.size and (ids.min() < 0 or ids.max() >= model.num_experts):
        raise ValueError(f"expert ids must lie in [0, {model.num_experts})")
    num_gpus, num_experts = placement.num_gpus, model.num_experts
    ids = ids.astype(np.int64)
    src = split_tokens(ids.shape[0], num_gpus)
    per_src = np.bincount((src[:, None] * num_experts + ids).ravel(), minlength=num_gpus * num_experts)
    per_src = per_src.reshape(num_gpus, num_experts)
    pair_counts = np.zeros((num_gpus, num_gpus, num_experts), dtype=np.int64)
    experts = np.arange(num_experts)
    pair_counts[:, placement.owner, experts] = per_src
    # distinct destination GPUs of each token: its owners sorted, each counted where it first appears
    # (tokens x top_k memory, never tokens x GPUs)
    dest = np.sort(placement.owner[ids], axis=1)
    first = np.ones(dest.shape, dtype=bool)
    first[:, 1:] = dest[:, 1:] != dest[:, :-1]
    pairs = np.broadcast_to(src[:, None], dest.shape)[first] * num_gpus + dest[first]
    dispatch_rows = np.bincount(pairs, minlength=num_gpus * num_gpus).reshape(num_gpus, num_gpus).astype(np.int64)
    tokens = np.bincount(src, minlength=num_gpus).astype(np.int64)
    return LayerWorkload(model, placement, pair_counts, dispatch_rows, tokens)


def workload_from_counts(source_expert_pairs, dispatch_rows, model: ModelPreset, placement: Placement,
                         tokens_per_gpu) -> LayerWorkload:
    """Rebuild a LayerWorkload from the counts a kernel exchanges (e.g. stored in a benchmark result).

    source_expert_pairs: int [G_src, E], pairs of source s routed to expert e.
    dispatch_rows: int [G_src, G_dst], distinct tokens of s that need GPU d.
    tokens_per_gpu: int [G].
    """
    pairs = np.asarray(source_expert_pairs, dtype=np.int64)
    rows = np.asarray(dispatch_rows, dtype=np.int64)
    tokens = np.asarray(tokens_per_gpu, dtype=np.int64)
    num_gpus, num_experts = placement.num_gpus, model.num_experts
    if placement.num_experts != num_experts:  # (e.g. a result's placement_owner of the wrong length)
        raise ValueError(f"placement ({placement.kind}) has {placement.num_experts} expert owners, {model.name} has "
                         f"{num_experts} experts")
    if pairs.shape != (num_gpus, num_experts) or rows.shape != (num_gpus, num_gpus) or tokens.shape != (num_gpus,):
        raise ValueError(f"counts must be [{num_gpus}, {num_experts}], [{num_gpus}, {num_gpus}] and [{num_gpus}]; "
                         f"got {pairs.shape}, {rows.shape}, {tokens.shape}")
    if (pairs < 0).any() or (rows < 0).any() or (pairs.sum(axis=1) != tokens * model.top_k).any():
        raise ValueError("counts are inconsistent: negative, or pairs per source != tokens * top_k")
    pair_counts = np.zeros((num_gpus, num_gpus, num_experts), dtype=np.int64)
    pair_counts[:, placement.owner, np.arange(num_experts)] = pairs
    return LayerWorkload(model, placement, pair_counts, rows, tokens)


def pairs_dispatched(w: LayerWorkload) -> LayerWorkload:
    """`w` as the megakernel moves it: one dispatch row per (token, expert) pair, not per distinct token (the
    dispatch_rows of its exchanged counts, which the engine's 'piece' order needs)."""
    return LayerWorkload(w.model, w.placement, w.pair_counts, w.pair_counts.sum(axis=2), w.tokens_per_gpu)


def model_workloads(routing, model: ModelPreset, placement) -> list[LayerWorkload]:
    """One LayerWorkload per layer from routing [num_tokens, num_layers, top_k]; placement: one Placement, or one
    per layer (placement_for)."""
    routing = np.asarray(routing)
    if routing.ndim != 3:
        raise ValueError(f"routing must be [num_tokens, num_layers, top_k], got shape {routing.shape}")
    return [layer_workload(routing[:, layer, :], model, placement_for(placement, layer))
            for layer in range(routing.shape[1])]
