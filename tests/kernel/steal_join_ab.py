"""Does joining the GEMM tiles late cost more than joining at once? One GPU (EP=1), `weave:C` whose C comm CTAs
wait D us from the kernel's start before they steal tiles, against the same policy without the wait (the comm
CTAs have no rows to dispatch at EP=1, so they join at once) and against `static:C` (they never join).

At EP=2 the loaded GPU's comm CTAs join after their dispatch, 2.5 ms into a 7 ms deepseek-v3 layer, and from then
on every tile of that GPU runs 11% slower (docs/kernel.md, "Stealing at the power cap"). If the same happens here,
where no link and no peer are involved, the cause is on the GPU itself (its power controller, its memory system)
and can be studied on one board.

The delay is compiled in: for each D the kernel sources are copied and patched (two anchors in megakernel.cuh;
the script stops if they are not found), so the shipped sources are not touched. Every variant is checked against
the fp32 reference (rel. error <= 1e-2, outputs poisoned before the call) and must equal the unpatched layer's
output bit for bit (each output row is computed by one tile, whichever CTA runs it). Then, per model:
- bench-style: all variants timed interleaved (median of repetitions of back-to-back calls);
- one recorded timeline per variant: median GEMM0 tile time of the compute CTAs (not the C comm CTAs) for tiles
  that start before the join and after it, each in us;
- with --sustained S: each variant back to back for S seconds while nvidia-smi samples the SM clock and power.
Prints one table per model; exits 1 on a failed check.

    python tests/kernel/steal_join_ab.py [--models deepseek-v3,deepseek-v2] [--tokens 4096] [--delays-us 1000,3000]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from weave_kernel.build import CSRC, load_extension
from weave_kernel.megakernel import MoEMegakernel
from weave_kernel.reference import make_weights, moe_reference
from weave_kernel.routing import bench_routing
from weave_kernel.symm import interleaved_time_ms
from weave_sim.placement import contiguous
from weave_sim.presets import get_model

TOL = 1e-2
ANCHOR_T0 = "  bool ok = routing_phase(p, s);\n"
ANCHOR_JOIN = "    if (ok && (!comm || (p.policy == kPolicyWeave && p.steal)))\n      ok = gemm_phases<"


def patched_csrc(delay_us: int, root: Path) -> Path:
    """A copy of the kernel sources whose weave comm CTAs sleep until delay_us after their kernel start."""
    dst = root / f"csrc_join{delay_us}"
    shutil.copytree(CSRC, dst)
    mk = dst / "megakernel.cuh"
    text = mk.read_text()
    if text.count(ANCHOR_T0) != 1 or text.count(ANCHOR_JOIN) != 1:
        raise SystemExit("megakernel.cuh changed: the anchors of the join-delay patch are gone; update this script")
    text = text.replace(ANCHOR_T0, "  const uint64_t join_t0 = globaltimer_ns();\n" + ANCHOR_T0)
    wait = (f"    if (ok && comm && p.policy == kPolicyWeave)\n"
            f"      while (globaltimer_ns() < join_t0 + {delay_us}ull * 1000ull) __nanosleep(1000);\n")
    text = text.replace(ANCHOR_JOIN, wait + ANCHOR_JOIN)
    mk.write_text(text)
    return dst


def tile_medians(events: list[dict], join_us: float) -> tuple[float, float, int, int]:
    """Median GEMM0 tile time (us) of the compute CTAs for tiles starting before / after join_us (from the first
    record of the call), and how many tiles each median is over. `events`: the layer's Chrome events
    (MoEMegakernel.timeline_events). GEMM0 only: GEMM1 tiles (K = I, not H) are far shorter and come later, so a
    median over both kinds moves with the mix, not with the tiles' speed."""
    t0 = min(e["ts"] for e in events)
    tiles = [e for e in events if e["name"] == "gemm0" and e["cat"] == "compute"]
    before = [e["dur"] for e in tiles if e["ts"] - t0 < join_us]
    after = [e["dur"] for e in tiles if e["ts"] - t0 >= join_us]
    med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
    return med(before), med(after), len(before), len(after)


class SmiSampler:
    """nvidia-smi's SM clock (MHz) and power (W) every 20 ms while running; (median MHz, median W)."""

    def __init__(self, index: int):
        self.index, self.rows, self.proc = index, [], None

    def __enter__(self):
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", str(self.index), "--query-gpu=clocks.sm,power.draw",
                 "--format=csv,noheader,nounits", "-lms", "20"], stdout=subprocess.PIPE, text=True)
        except OSError:
            self.proc = None
            return self
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, w = (float(v) for v in line.split(","))
                self.rows.append((mhz, w))
            except ValueError:
                pass

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def medians(self) -> tuple[float, float]:
        if not self.rows:
            return float("nan"), float("nan")
        return statistics.median(r[0] for r in self.rows), statistics.median(r[1] for r in self.rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="deepseek-v3,deepseek-v2,qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--comm", type=int, default=8, help="C of static:C / weave:C")
    ap.add_argument("--delays-us", default="1000,3000", help="join delays to compile, us after the kernel start")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--sustained", type=float, default=0.0, help="seconds of back-to-back calls per variant")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    delays = [int(d) for d in args.delays_us.split(",") if d]
    if any(d <= 0 or d > 50_000 for d in delays):
        raise SystemExit("--delays-us: each delay must be in (0, 50000] us (the kernel's spins time out after 2 s)")
    C = args.comm
    root = Path(tempfile.mkdtemp(prefix="weave_join_"))
    t_build = time.perf_counter()
    exts = {0: load_extension()} | {d: load_extension(csrc=patched_csrc(d, root)) for d in delays}
    print(f"# built {len(exts)} kernels in {time.perf_counter() - t_build:.0f} s; device {torch.cuda.get_device_name(dev)}",
          flush=True)
    variants = [("static", 0)] + [("weave", 0)] + [("weave", d) for d in delays]
    label = lambda v: f"static:{C}" if v[0] == "static" else (f"weave:{C}" + (f" join {v[1]} us" if v[1] else ""))  # noqa: E731
    rows, failures = [], []
    for name in args.models.split(","):
        m = get_model(name)
        E, H, I, k, n = m.num_experts, m.hidden_size, m.expert_ffn_size, m.top_k, args.tokens
        w13, w2 = make_weights(E, H, I, device=dev, generator=torch.Generator(device=dev).manual_seed(7))
        layers = {d: MoEMegakernel(hidden=H, inter=I, num_experts=E, top_k=k, placement=contiguous(E, 1),
                                   max_tokens=n, ext=ext, timeline_per_cta=512) for d, ext in exts.items()}
        ids, w = bench_routing(n, E, k, seed=0, rank=0)
        x = torch.randn(n, H, device=dev).to(torch.bfloat16)
        ids_d, w_d = torch.as_tensor(ids).to(dev), torch.as_tensor(w).to(dev)
        ref = moe_reference(x, ids_d, w_d, w13, w2)
        base = None
        for v in variants:
            layer = layers[v[1]]
            y = torch.full((n, H), float("nan"), dtype=torch.bfloat16, device=dev)
            layer.poison_scratch()
            layer(x, ids_d, w_d, w13, w2, policy=label(v).split()[0], out=y)
            torch.cuda.synchronize()
            err = float((y.float() - ref).norm() / ref.norm())
            base = y if base is None else base
            same = bool(torch.equal(y, base))
            ok = err <= TOL and same
            print(f"{'PASS' if ok else 'FAIL'} {name} {n} {label(v)}: rel_err {err:.2e}, equal to static:{C} {same}",
                  flush=True)
            if not ok:
                failures.append(f"{name} {label(v)}")
        fns = {label(v): (lambda layer=layers[v[1]], pol=label(v).split()[0]:
                          layer(x, ids_d, w_d, w13, w2, policy=pol, check=False)) for v in variants}
        t = interleaved_time_ms(fns, warmup=2, repeats=args.repeats, calls=args.calls)
        for layer in layers.values():
            layer.raise_if_error()
        res = {}
        for v in variants:
            layer, pol = layers[v[1]], label(v).split()[0]
            mhz = watts = float("nan")
            if args.sustained > 0:
                with SmiSampler(dev.index or 0) as smi:
                    end = time.perf_counter() + args.sustained
                    while time.perf_counter() < end:
                        for _ in range(8):
                            layer(x, ids_d, w_d, w13, w2, policy=pol, check=False)
                        torch.cuda.synchronize()
                mhz, watts = smi.medians()
            layer(x, ids_d, w_d, w13, w2, policy=pol, record_timeline=True)
            torch.cuda.synchronize()
            join = v[1] if v[0] == "weave" and v[1] else 0.0
            split = join if join else 1000.0  # unpatched: the same 1 ms split, for comparison
            b, a, nb, na = tile_medians(layer.timeline_events()[0], split)
            res[label(v)] = {"ms": t[label(v)], "tile_us_before": b, "tile_us_after": a, "split_us": split,
                             "tiles_before": nb, "tiles_after": na, "sm_mhz": mhz, "power_w": watts}
        rows.append({"model": name, "tokens": n, "comm": C, "variants": res})
        ref_ms = res[f"static:{C}"]["ms"]
        print(f"\n{name} {n} tokens, EP=1, {torch.cuda.get_device_name(dev)}; t / t(static:{C}), below 1 = faster")
        print(f"{'variant':<24}{'ms':>8}{'ratio':>7}{'g0 us <split':>15}{'g0 us >=split':>16}{'split us':>9}"
              f"{'MHz':>7}{'W':>6}")
        for lab, r in res.items():
            print(f"{lab:<24}{r['ms']:>8.3f}{r['ms'] / ref_ms:>7.3f}{r['tile_us_before']:>15.1f}"
                  f"{r['tile_us_after']:>16.1f}{r['split_us']:>9.0f}{r['sm_mhz']:>7.0f}{r['power_w']:>6.0f}", flush=True)
        del layers
        torch.cuda.empty_cache()
    print(f"SUMMARY: {len(failures)} failures" + (": " + "; ".join(failures) if failures else ""))
    if args.out:
        json.dump({"device": torch.cuda.get_device_name(dev), "args": vars(args), "rows": rows,
                   "failures": failures}, open(args.out, "w"), indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
