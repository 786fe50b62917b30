"""GPU probe (not a pytest file): the calibration GEMM (the megakernel's own tiles through run_tiles, csrc/calib.cuh)
of this package's kernel sources (A) against another version's (B, e.g. the previous commit's csrc copied into a
folder), in one process, alternating, at several rows per expert. Answers "what does a change of the tile cost or
gain at a given block size", e.g. half tiles for blocks of at most 64 rows (wgmma.cuh, mma_stage_half).

    python tests/kernel/tile_rows_ab.py --other tests/kernel/_ab_old_csrc [--rows 16,32,64,96,128] [--k 2048,7168]

For every (rows, K): A's and B's outputs against torch (rel. error, limit 1e-2) and against each other (elements
that differ; outputs poisoned with NaN before each checked call), then median times of `--repeats` rounds, each
round timing A and B back to back (order alternating), and t(B) / t(A) (above 1: A is faster). One GPU, one rank.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from weave_kernel.build import load_extension
from weave_kernel.calibrate import BLOCK_ROWS, GEMM_N, TIMEOUT_NS, experts_for, useful_tflops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="folder with the other kernel sources (B)")
    ap.add_argument("--rows", default="16,32,64,65,96,128,192,256", help="rows per expert, comma-separated")
    ap.add_argument("--k", default="2048,7168", help="K (reduction length), comma-separated multiples of 64")
    ap.add_argument("--tiles", type=int, default=2048, help="about this many output tiles per call")
    ap.add_argument("--ctas", type=int, default=0, help="grid (0: one CTA per SM)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3, help="back-to-back calls timed per measurement")
    args = ap.parse_args(argv)
    dev = torch.device("cuda", 0)
    ctas = args.ctas or torch.cuda.get_device_properties(dev).multi_processor_count
    exts = {"A": load_extension(), "B": load_extension(csrc=args.other)}
    err = torch.zeros(4, dtype=torch.int32, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    gen = torch.Generator(device=dev)
    rows_list = [int(r) for r in args.rows.split(",") if r]
    k_list = [int(k) for k in args.k.split(",") if k]
    if any(k % 64 for k in k_list) or any(r < 1 for r in rows_list):
        ap.error("K must be multiples of 64, rows positive")
    table = []
    for K in k_list:
        for rows in rows_list:
            e = experts_for(rows, args.tiles)
            gen.manual_seed(rows * 100003 + K)
            a = torch.randn(e * rows, K, device=dev, dtype=torch.bfloat16, generator=gen)
            b = torch.randn(e, GEMM_N, K, device=dev, dtype=torch.bfloat16, generator=gen) * K ** -0.5
            c = {v: torch.empty(e * rows, GEMM_N, device=dev, dtype=torch.bfloat16) for v in exts}
            tickets = torch.zeros(1, dtype=torch.int32, device=dev)
            grid_bar = torch.zeros(2, dtype=torch.int32, device=dev)

            def call(v):
                params = {"err": err.data_ptr(), "timeout_ns": TIMEOUT_NS, "a": a.data_ptr(), "b": b.data_ptr(),
                          "c": c[v].data_ptr(), "tickets": tickets.data_ptr(), "grid_bar": grid_bar.data_ptr(),
                          "num_experts": e, "rows_per_expert": rows, "n": GEMM_N, "k": K, "num_chunks": 1}
                exts[v].calib_gemm(params, ctas, stream)

            def check(what):
                torch.cuda.synchronize(dev)
                if err[0].item():
                    raise RuntimeError(f"{what}: kernel error {err.tolist()}")

            rel = {}
            for v in exts:
                c[v].fill_(float("nan"))
                call(v)
                check(f"{v} rows {rows} K {K}")
                ref = (a.float().view(e, rows, K) @ b.float().transpose(1, 2)).view(e * rows, GEMM_N)
                rel[v] = ((c[v].float() - ref).norm() / ref.norm()).item()
                del ref
            differ = int((c["A"] != c["B"]).sum().item())
            times = {v: [] for v in exts}
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for rep in range(args.repeats + 1):
                for v in (("A", "B") if rep % 2 == 0 else ("B", "A")):
                    start.record()
                    for _ in range(args.calls):
                        call(v)
                    end.record()
                    end.synchronize()
                    if rep > 0:
                        times[v].append(start.elapsed_time(end) / args.calls)
            check(f"timing rows {rows} K {K}")
            ms = {v: statistics.median(t) for v, t in times.items()}
            ok = all(r < 1e-2 for r in rel.values())
            table.append((K, rows, e, ms["A"], ms["B"], useful_tflops(e, rows, ms["A"], k=K),
                          useful_tflops(e, rows, ms["B"], k=K), rel["A"], rel["B"], differ, ok))
            print(f"{'PASS' if ok else 'FAIL'} K {K} rows {rows}: rel. error A {rel['A']:.2e} B {rel['B']:.2e}, "
                  f"{differ} of {c['A'].numel()} outputs differ between A and B", flush=True)
    print(f"\ncalibration GEMM, {ctas} CTAs, N {GEMM_N}, about {args.tiles} tiles of {BLOCK_ROWS} x 256; A = this "
          f"package's sources, B = {args.other}; median of {args.repeats} alternating rounds of {args.calls} calls")
    print(f"{'K':>5} {'rows':>5} {'experts':>7} {'A ms':>8} {'B ms':>8} {'A TF/s':>7} {'B TF/s':>7} {'t(B)/t(A)':>9} "
          f"{'A!=B':>8}")
    for K, rows, e, ta, tb, fa, fb, ra, rb, differ, ok in table:
        print(f"{K:>5} {rows:>5} {e:>7} {ta:>8.3f} {tb:>8.3f} {fa:>7.0f} {fb:>7.0f} {tb / ta:>9.3f} {differ:>8}"
              f"{'' if ok else '  FAIL'}")
    return 0 if all(row[-1] for row in table) else 1


if __name__ == "__main__":
    raise SystemExit(main())
