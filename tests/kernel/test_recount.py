import numpy as np

from weave_kernel.recount import counts_for
from weave_kernel.routing import skewed_routing


def test_counts_match_the_benchmark_routing():
    r = {"gpus": 2, "tokens_per_gpu": 96, "experts": 8, "top_k": 2}
    c = counts_for(r, {"seed": 0, "zipf": 1.0})
    pairs = np.array(c["source_expert_pairs"])
    assert pairs.shape == (2, 8) and (pairs.sum(axis=1) == 96 * 2).all()
    ids1, _ = skewed_routing(96, 8, 2, seed=1 * 7 + 96, zipf_s=1.0)  # rank 1's seed in the benchmark
    assert (pairs[1] == np.bincount(ids1.ravel(), minlength=8)).all()
    rows = np.array(c["dispatch_rows"])  # pairs per (source, destination): experts 0-3 on GPU 0, 4-7 on GPU 1
    assert (rows[:, 0] == pairs[:, :4].sum(axis=1)).all() and (rows[:, 1] == pairs[:, 4:].sum(axis=1)).all()
