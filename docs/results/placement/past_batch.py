"""Balanced placement built from another prefill batch of the GPT-OSS-20B trace (seed 1) applied to this one
(seed 0), against contiguous and against balancing on this batch itself: EP=4, 2048 tokens per GPU, layers 0, 3, .., 21,
engine policies, profile h200-megakernel-ep2. Run from the repository root: python docs/results/placement/past_batch.py"""
import numpy as np
from weave_sim.config import RunConfig, resolve
from weave_sim.placement import balanced_per_layer
from weave_sim.engine import simulate_model
G, N = 4, 2048
layers = tuple(range(0, 24, 3))
res = {}
for seed in (0, 1):
    res[seed] = resolve(RunConfig(num_gpus=G, tokens_per_gpu=N, seed=seed, layers=layers, profile="h200-megakernel-ep2"))
r0 = res[0]
now = balanced_per_layer(r0.routing, 32, G)
past = balanced_per_layer(res[1].routing, 32, G)
out = {}
for name, pl in (("contiguous", r0.placement), ("balanced (this batch)", now), ("balanced (another batch)", past)):
    gl = [np.bincount((pl if not isinstance(pl, list) else pl[i]).owner[r0.routing[:, i].ravel()], minlength=G) for i in range(len(layers))]
    imb = np.mean([g.max() / g.mean() for g in gl])
    t = {pol: simulate_model(r0.routing, r0.model, pl, r0.profile, pol).total_ns / 1e3 for pol in ("static:20", "weave")}
    out[name] = t
    print(f"{name:26s} GPU max/mean {imb:.3f}  static:20 {t['static:20']:.0f} us  weave {t['weave']:.0f} us", flush=True)
