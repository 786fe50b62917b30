"""Seeded routing generators for tests and benchmarks (numpy only).

`skewed_routing` draws k distinct experts per token with probabilities proportional to a Zipf law over a
random permutation of the experts (Gumbel top-k: exact sampling without replacement), so some experts are hot
and some receive nothing. Softmax-like weights that sum to 1 per token.
"""
from __future__ import annotations

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
