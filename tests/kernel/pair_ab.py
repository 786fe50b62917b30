"""A/B on one GPU (EP=1): the megakernel with paired tickets (2-CTA clusters, `pair_tiles=True`) against the same
kernel without, in one process, calls alternating. Each configuration first checks both layers against the
fp32 reference (rel. error <= 1e-2, outputs poisoned) and against each other (every output row is computed by
one tile, whichever CTA runs it, so both must be bitwise equal), then times the policies interleaved.
Usage: python tests/kernel/pair_ab.py [--models a,b] [--tokens 2048,4096] [--out ab.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from weave_kernel.megakernel import MoEMegakernel
from weave_kernel.reference import make_weights, moe_reference
from weave_kernel.routing import bench_routing
from weave_kernel.symm import interleaved_time_ms
from weave_sim.placement import contiguous
from weave_sim.presets import WEAVE_EVAL_MODELS, get_model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(WEAVE_EVAL_MODELS))
    ap.add_argument("--tokens", default="2048,4096")
    ap.add_argument("--policies", default="sequential,static:8,static:20,static:21,weave")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--b", type=int, default=1, help="pair_tiles of layer B (2: clusters, claims not paired)")
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    pols = args.policies.split(",")
    rows, failures = [], []
    for name in args.models.split(","):
        m = get_model(name)
        E, H, I, k = m.num_experts, m.hidden_size, m.expert_ffn_size, m.top_k
        w13, w2 = make_weights(E, H, I, device=dev, generator=torch.Generator(device=dev).manual_seed(7))
        for n in (int(t) for t in args.tokens.split(",")):
            layers = {pt: MoEMegakernel(hidden=H, inter=I, num_experts=E, top_k=k, placement=contiguous(E, 1),
                                        max_tokens=n, pair_tiles=args.b if pt else 0) for pt in (False, True)}
            ids, w = bench_routing(n, E, k, seed=0, rank=0)
            x = torch.randn(n, H, device=dev).to(torch.bfloat16)
            ids_d, w_d = torch.as_tensor(ids).to(dev), torch.as_tensor(w).to(dev)
            ref = moe_reference(x, ids_d, w_d, w13, w2)
            for pol in pols:
                ys = {}
                for pt, layer in layers.items():
                    y = torch.full((n, H), float("nan"), dtype=torch.bfloat16, device=dev)
                    layer.poison_scratch()
                    layer(x, ids_d, w_d, w13, w2, policy=pol, out=y)
                    torch.cuda.synchronize()
                    ys[pt] = y
                err = {pt: float((y.float() - ref).norm() / ref.norm()) for pt, y in ys.items()}
                same = bool(torch.equal(ys[False], ys[True]))
                ok = same and all(e <= 1e-2 for e in err.values())
                print(f"{'PASS' if ok else 'FAIL'} {name} {n} {pol}: rel_err {err[False]:.2e} / {err[True]:.2e}, "
                      f"bitwise equal {same}", flush=True)
                if not ok:
                    failures.append(f"{name} {n} {pol}")
            fns = {f"{pol}|{pt}": (lambda layer=layer, pol=pol: layer(x, ids_d, w_d, w13, w2, policy=pol,
                                                                        check=False))
                   for pol in pols for pt, layer in layers.items()}
            t = interleaved_time_ms(fns, warmup=2, repeats=args.repeats, calls=4)
            for layer in layers.values():
                layer.raise_if_error()
            for pol in pols:
                a, b = t[f"{pol}|False"], t[f"{pol}|True"]
                rows.append({"model": name, "tokens": n, "policy": pol, "unpaired_ms": a, "paired_ms": b})
                print(f"  {name:<16} {n:>5} {pol:<11} unpaired {a:.3f} ms  paired {b:.3f} ms  ratio {a / b:.3f}",
                      flush=True)
            del layers
            torch.cuda.empty_cache()
    print("\ngeomean t(unpaired) / t(paired), above 1 = paired faster")
    for pol in pols:
        r = [row["unpaired_ms"] / row["paired_ms"] for row in rows if row["policy"] == pol]
        print(f"  {pol:<11} {math.exp(sum(map(math.log, r)) / len(r)):.3f}  (range {min(r):.3f}-{max(r):.3f}, "
              f"{len(r)} configs)")
    print(f"SUMMARY: {len(failures)} failures" + (": " + "; ".join(failures) if failures else ""))
    if args.out:
        json.dump({"device": torch.cuda.get_device_name(dev), "rows": rows, "failures": failures},
                  open(args.out, "w"), indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
