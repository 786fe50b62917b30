"""Rebuild traces/gpt-oss-20b-subset.npz from the full GPT-OSS-20B routing file.

    python traces/make_subset.py PATH/TO/gpt-oss-20b-dev.npz            # writes traces/gpt-oss-20b-subset.npz

The full file (102,282 decode tokens of 333 requests, from
github.com/AmanPriyanshu/GPT-OSS-MoE-ExpertFingerprinting @ 72b368f, Apache-2.0) is described in
traces/NOTICE. The subset keeps complete requests only: requests are visited in a seeded random order
and taken while they fit in the token budget, then written in their original order in the interchange
format (traces/README.md), with the per-request descriptions moved into the metadata.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from weave_sim.traces import RoutingTrace, load_trace, save_trace  # noqa: E402

SOURCE = "github.com/AmanPriyanshu/GPT-OSS-MoE-ExpertFingerprinting@72b368f"
DEFAULT_OUT = Path(__file__).resolve().parent / "gpt-oss-20b-subset.npz"


def pick_requests(lengths: np.ndarray, budget_tokens: int, seed: int) -> np.ndarray:
    """Indices of whole requests (sorted) whose total length is at most budget_tokens."""
    rng = np.random.default_rng(seed)
    chosen, total = [], 0
    for request_idx in rng.permutation(lengths.size):
        if total + lengths[request_idx] <= budget_tokens:
            chosen.append(request_idx)
            total += int(lengths[request_idx])
    return np.sort(np.array(chosen, dtype=np.int64))


def make_subset(src: Path, out: Path, budget_tokens: int, seed: int) -> dict:
    full = load_trace(src, model="gpt-oss-20b")
    with np.load(src, allow_pickle=False) as raw:
        requests = json.loads(str(raw["requests"])) if "requests" in raw.files else None
    request_ids, lengths = np.unique(full.request_id, return_counts=True)
    keep = request_ids[pick_requests(lengths, budget_tokens, seed)]
    token_idx = np.flatnonzero(np.isin(full.request_id, keep))
    subset = full.select(token_idx)
    meta = {
        "model": "gpt-oss-20b",
        "source": f"{SOURCE} (decode tokens of openai/gpt-oss-20b, batch 1)",
        "license": "Apache-2.0",
        "modified": (f"subset by weave traces/make_subset.py: {keep.size} complete requests of "
                     f"{request_ids.size}, {token_idx.size} of {full.num_tokens} tokens (seed {seed}); "
                     f"converted to the weave interchange format"),
        "subset_request_ids": keep.tolist(),
    }
    if requests is not None:
        meta["requests"] = [{"request_id": int(r), **requests[int(r)]} for r in keep]
    save_trace(out, RoutingTrace(subset.topk_ids, subset.topk_probs, subset.request_id, subset.position, meta))
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the full gpt-oss-20b-dev.npz")
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tokens", type=int, default=12288, help="token budget (default 12288)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    meta = make_subset(args.src, args.out, args.tokens, args.seed)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB): {meta['modified']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
