"""FP8 experts on the GPU (MoEMegakernel(expert_dtype="fp8"), weave_kernel/fp8.py): correctness, then speed at EP=1.

Correctness. Each case draws fresh random inputs, quantizes the experts' weights to e4m3 with 128 x 128 block scales
(fp8.quantize_experts), poisons the output and every scratch row before each call, runs every policy on the same
layer and compares y with fp8.moe_reference_fp8 (fp32, the same quantization of x, h quantized from its own fp32
SwiGLU): ||y - ref|| / ||ref|| <= TOL. A row's result does not depend on which CTA computed it or when, so every
policy must give the same bits (a difference is a race). The error against the bf16 reference on the dequantized
weights (what quantizing x and h costs) is printed beside it, and the kernel's quantization of x must equal
fp8.quantize_act bit for bit. Then the same on virtual ranks (G = 2, 4), and the
inputs the layer must refuse.

Speed (--bench): the six models' layers at EP=1 (every routed expert on this GPU), bf16 against FP8, Zipf(1.0)
routing, interleaved in one process (bf16, FP8, bf16 again: the drift): median of REPS timed calls (CUDA events,
2 warm-up calls); the FP8 layer quantizes x itself, inside the kernel. A quick look, not the measure of FP8's gain:
the FP8 calls run at the clock the bf16 calls before them left, which at the 700 W cap is lower than an FP8 layer
holds on its own, so the gain comes out low (1.29x here against 1.38x with each format in its own `bench` process;
docs/kernel.md, "The FP8 tile factor, measured in one harness"). --gpu-state logs the clock of each timing. Prints one
line per check, a table last, exits 1 on any failure. Usage: python tests/kernel/fp8_worker.py [--bench] [--tokens 2048,4096,8192] [--reps 7]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback

import torch

from weave_kernel.fp8 import (dequant_weight, moe_reference_fp8, quantize_act, quantize_experts, quantize_weight,
                               shared_ffn_fp8)
from weave_kernel.gpu_state import GpuStateSampler
from weave_kernel.megakernel import MoEMegakernel
from weave_kernel.reference import make_shared_weights, make_weights, moe_reference
from weave_kernel.routing import skewed_routing
from weave_kernel.virtual import VirtualRanks
from virtual_worker import log, rank_experts, rel_err  # (this folder is the script's: sys.path[0]; refs passed in fp32)
from weave_sim.placement import contiguous
from weave_sim.presets import get_model

# The FP8 tensor cores accumulate a k step's products with less than fp32's precision (tile_limits mode 17: 1.8e-4 of
# the products' magnitude over K = 7168), and the kernel keeps its accumulators in them across k steps (scale_acc).
# h then differs slightly from the reference's fp32 h, enough to move some of its elements across an e4m3 rounding
# boundary (one e4m3 step is 6-12% of the value): about 1% of y's norm on the larger layers. Two bounds: against the
# FP8 reference, and against the bf16 layer on the same (dequantized) weights no more than 15% (+ 2e-3) further
# away than the FP8 reference itself is (quantizing x and h costs 4-5% there).
TOL = 3e-2
FAILURES: list[str] = []
POLICIES = ("sequential", "static:1", "static:8", "weave", "weave:16", "weave-nosteal")




def check(ok: bool, what: str) -> None:
    log(("PASS " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


def routing(n: int, e: int, k: int, seed: int, dev):
    ids, w = skewed_routing(n, e, k, seed=seed)
    return torch.as_tensor(ids, device=dev), torch.as_tensor(w, device=dev)


def case_real(name: str, *, hidden: int, inter: int, experts: int, top_k: int, tokens: list[int], seed: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device="cpu").manual_seed(seed)
    w13b, w2b = make_weights(experts, hidden, inter, generator=g)
    w13, w2 = quantize_experts(w13b.to(dev), w2b.to(dev))
    w13d = dequant_weight(*w13).to(torch.bfloat16)  # the bf16 reference's weights: what the e4m3 blocks hold
    w2d = dequant_weight(*w2).to(torch.bfloat16)
    layer = MoEMegakernel(hidden=hidden, inter=inter, num_experts=experts, top_k=top_k,
                          placement=contiguous(experts, 1), max_tokens=max(tokens), device=dev, expert_dtype="fp8")
    for n in tokens:
        x = (torch.randn(n, hidden, generator=g) * 0.5).to(torch.bfloat16).to(dev)
        ids, tw = routing(n, experts, top_k, seed + n, dev)
        ref = moe_reference_fp8(x, ids, tw, w13, w2).float()
        ref16 = moe_reference(x, ids, tw, w13d, w2d).float()
        q_err = rel_err(ref, ref16)  # what the FP8 formats cost, by the reference
        first = None
        for pol in POLICIES:
            out = torch.full((n, hidden), float("nan"), dtype=torch.bfloat16, device=dev)
            layer.poison_scratch()
            torch.cuda.synchronize()
            y = layer(x, ids, tw, w13, w2, policy=pol, out=out)
            torch.cuda.synchronize()
            e, e16 = rel_err(y, ref), rel_err(y, ref16)
            same = first is None or torch.equal(y.view(torch.int16), first.view(torch.int16))
            first = y.clone() if first is None else first
            check(e <= TOL and e16 <= 1.15 * q_err + 2e-3 and same,
                  f"{name} n={n} {pol}: rel. err {e:.2e} vs fp8 reference, {e16:.2e} vs bf16 on the dequantized "
                  f"weights (fp8 reference: {q_err:.2e}); bits equal to {POLICIES[0]}: {same}")
        # the kernel's own quantization of x (routing phase) against fp8.quantize_act, bit for bit
        kq, ks = layer.quantized_x(n)
        rq, rs = quantize_act(x)
        qd = int((kq.view(torch.uint8) != rq.view(torch.uint8)).sum())
        sd = int((ks != rs).sum())
        check(qd == 0 and sd == 0, f"{name} n={n}: the kernel's x in e4m3 and its scales equal fp8.quantize_act(x) "
              f"bit for bit ({qd} of {kq.numel()} codes, {sd} of {ks.numel()} scales differ)")


def case_shared(name: str, *, hidden: int, inter: int, experts: int, top_k: int, shared_inter: int, tokens: list[int],
                seed: int) -> None:
    """An FP8 layer with an FP8 shared expert (DeepSeek-style): both ticket orders, with and without a per-token gate,
    every policy, against moe_reference_fp8 + fp8.shared_ffn_fp8 (rounded to bf16, as the kernel's ys); the same
    layer called without the shared expert in between."""
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device="cpu").manual_seed(seed)
    w13b, w2b = make_weights(experts, hidden, inter, generator=g)
    w13, w2 = quantize_experts(w13b.to(dev), w2b.to(dev))
    s13, s2 = make_shared_weights(hidden, shared_inter, generator=g)
    sw = (quantize_weight(s13.to(dev)), quantize_weight(s2.to(dev)))
    layer = MoEMegakernel(hidden=hidden, inter=inter, num_experts=experts, top_k=top_k,
                          placement=contiguous(experts, 1), max_tokens=max(tokens), device=dev, expert_dtype="fp8",
                          shared_inter=shared_inter)
    for n in tokens:
        x = (torch.randn(n, hidden, generator=g) * 0.5).to(torch.bfloat16).to(dev)
        ids, tw = routing(n, experts, top_k, seed + n, dev)
        gate = torch.rand(n, generator=g).to(dev)
        routed = moe_reference_fp8(x, ids, tw, w13, w2).float()
        ys = shared_ffn_fp8(x, *sw).to(torch.bfloat16).float()
        for order, sc in (("last", None), ("first", gate), (None, None)):
            ref = routed if order is None else routed + (ys if sc is None else ys * sc[:, None])
            first = None
            for pol in POLICIES:
                out = torch.full((n, hidden), float("nan"), dtype=torch.bfloat16, device=dev)
                layer.poison_scratch()
                torch.cuda.synchronize()
                kw = {} if order is None else {"shared": sw, "shared_order": order, "shared_scale": sc}
                y = layer(x, ids, tw, w13, w2, policy=pol, out=out, **kw)
                torch.cuda.synchronize()
                e = rel_err(y, ref)
                same = first is None or torch.equal(y.view(torch.int16), first.view(torch.int16))
                first = y.clone() if first is None else first
                check(e <= TOL and same, f"{name} n={n} shared {order}{' gated' if sc is not None else ''} {pol}: "
                      f"rel. err {e:.2e} vs fp8 reference; bits equal to {POLICIES[0]}: {same}")


def case_virtual(world: int, *, hidden: int, inter: int, experts: int, top_k: int, seed: int,
                 dispatch: str = "threads") -> None:
    """G virtual ranks against moe_reference_fp8 on every policy; with dispatch="bulk..." also bit for bit against
    the same calls dispatched by threads (the copy path must not change a byte)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device="cpu").manual_seed(seed)
    w13b, w2b = make_weights(experts, hidden, inter, generator=g)
    w13, w2 = quantize_experts(w13b.to(dev), w2b.to(dev))
    pl = contiguous(experts, world)
    tokens = [int(t) for t in torch.randint(0, 300, (world,), generator=g)]
    tokens[0] = 0 if world > 2 else tokens[0]  # a rank without tokens
    vr = VirtualRanks(world, hidden=hidden, inter=inter, num_experts=experts, top_k=top_k,
                      placement=pl, max_tokens=300, device=dev, expert_dtype="fp8", dispatch=dispatch)
    twin = None if dispatch == "threads" else VirtualRanks(
        world, hidden=hidden, inter=inter, num_experts=experts, top_k=top_k, placement=pl, max_tokens=300, device=dev,
        expert_dtype="fp8")
    xs = [(torch.randn(n, hidden, generator=g) * 0.5).to(torch.bfloat16).to(dev) for n in tokens]
    routed = [routing(n, experts, top_k, seed + 7 * r, dev) for r, n in enumerate(tokens)]
    ids = [r[0] for r in routed]
    tws = [r[1] for r in routed]
    w13s = [rank_experts(w13, pl, r) for r in range(world)]
    w2s = [rank_experts(w2, pl, r) for r in range(world)]
    ref = moe_reference_fp8(torch.cat(xs), torch.cat(ids), torch.cat(tws), w13, w2).float()
    for pol in ("sequential", "static:4", "weave", "weave-nosteal"):
        vr.poison_scratch()
        ys = vr(xs, ids, tws, w13s, w2s, policy=pol)
        e = rel_err(torch.cat(ys), ref)
        same = True
        if twin is not None:
            twin.poison_scratch()
            yt = twin(xs, ids, tws, w13s, w2s, policy=pol)
            same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(ys, yt))
        check(e <= TOL and same, f"virtual G={world} H={hidden} dispatch {dispatch} tokens {tokens} {pol}: rel. err "
              f"{e:.2e}" + ("" if twin is None else f"; bits equal to dispatch by threads: {same}"))


def refusals() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    kw = dict(hidden=256, inter=256, num_experts=8, top_k=2, placement=contiguous(8, 1), max_tokens=64, device=dev)
    for what, extra in (("a shared expert of width 192", dict(shared_inter=192)),
                        ("hidden 320", dict(hidden=320)), ("dtype fp16", dict(expert_dtype="fp16"))):
        try:
            MoEMegakernel(**{**kw, "expert_dtype": "fp8", **extra})
            check(False, f"fp8 layer with {what} refused")
        except ValueError as exc:
            check(True, f"fp8 layer with {what} refused: {exc}")
    layer = MoEMegakernel(**kw, expert_dtype="fp8")
    w13b, w2b = make_weights(8, 256, 256, device=dev)
    x = torch.randn(16, 256, device=dev).to(torch.bfloat16)
    ids, tw = routing(16, 8, 2, 0, dev)
    for what, args in (("bf16 weights", (w13b, w2b)), ("swapped pairs", tuple(reversed(quantize_experts(w13b, w2b))))):
        try:
            layer(x, ids, tw, *args)
            check(False, f"fp8 call with {what} refused")
        except (TypeError, ValueError) as exc:
            check(True, f"fp8 call with {what} refused: {str(exc)[:100]}")
    bf = MoEMegakernel(**kw)
    try:
        bf(x, ids, tw, *quantize_experts(w13b, w2b))
        check(False, "bf16 call with fp8 pairs refused")
    except (TypeError, ValueError) as exc:
        check(True, f"bf16 call with fp8 pairs refused: {str(exc)[:100]}")


def timed(fn, reps: int) -> float:
    """Median ms of `reps` calls (2 warm-up calls first)."""
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def quantize_chunked(w13: torch.Tensor, w2: torch.Tensor, chunk: int = 16):
    """fp8.quantize_experts a few experts at a time (its fp32 temporaries for all of deepseek-v3's experts would
    not fit beside the layers)."""
    parts = [quantize_experts(w13[i:i + chunk], w2[i:i + chunk]) for i in range(0, w13.shape[0], chunk)]
    cat = lambda ts: torch.cat(ts).contiguous()  # noqa: E731
    return ((cat([p[0][0] for p in parts]), cat([p[0][1] for p in parts])),
            (cat([p[1][0] for p in parts]), cat([p[1][1] for p in parts])))


def bench(models: list[str], tokens: list[int], reps: int, gpu_state: bool = False) -> list[tuple]:
    """bf16, FP8, bf16 again per (model, tokens, policy), each the median of `reps` back-to-back calls. gpu_state:
    also the median SM clock (MHz) nvidia-smi sampled while each was timed (weave_kernel.gpu_state, every 100 ms:
    a timing shorter than that gets the nearest sample; None where it did not answer), logged beside the times
    (docs/kernel.md, "The FP8 tile factor, measured in one harness")."""
    dev = torch.device("cuda", torch.cuda.current_device())
    sampler = GpuStateSampler.for_device(dev) if gpu_state else None

    def clocked(fn) -> tuple[float, float | None]:
        t0 = time.time()
        ms = timed(fn, reps)
        s = sampler.summary(t0, time.time()) if sampler is not None else None
        return ms, (s["sm_mhz_median"] if s else None)

    try:
        return _bench_rows(models, tokens, dev, clocked)
    finally:
        if sampler is not None:
            sampler.stop()


def _bench_rows(models: list[str], tokens: list[int], dev, clocked) -> list[tuple]:
    rows = []
    for name in models:
        m = get_model(name)
        H, I, E, k = m.hidden_size, m.expert_ffn_size, m.num_experts, m.top_k
        w13b, w2b = make_weights(E, H, I, device=dev)
        w13, w2 = quantize_chunked(w13b, w2b)
        kw = dict(hidden=H, inter=I, num_experts=E, top_k=k, placement=contiguous(E, 1), max_tokens=max(tokens),
                  device=dev)
        lb, l8 = MoEMegakernel(**kw), MoEMegakernel(**kw, expert_dtype="fp8")
        for n in tokens:
            x = torch.randn(n, H, device=dev).to(torch.bfloat16)
            ids, tw = routing(n, E, k, 1, dev)
            for pol in ("static:8", "weave"):
                tb, cb = clocked(lambda: lb(x, ids, tw, w13b, w2b, policy=pol, check=False))
                t8, c8 = clocked(lambda: l8(x, ids, tw, w13, w2, policy=pol, check=False))
                tb2, cb2 = clocked(lambda: lb(x, ids, tw, w13b, w2b, policy=pol, check=False))  # drift between
                flops = 2 * 3 * H * I * n * k
                rows.append((name, n, pol, tb, tb2, t8, flops / tb / 1e9, flops / t8 / 1e9, tb / t8))
                mhz = (f", SM MHz {cb:.0f} / {c8:.0f} / {cb2:.0f}" if None not in (cb, c8, cb2) else "")
                log(f"BENCH {name} n={n} {pol}: bf16 {tb:.3f} / {tb2:.3f} ms, fp8 {t8:.3f} ms, "
                    f"{flops / t8 / 1e9:.0f} TFLOP/s, bf16 / fp8 {tb / t8:.3f}x{mhz}")
            lb.raise_if_error()
            l8.raise_if_error()
        del lb, l8, w13b, w2b, w13, w2
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = False  # the references in fp32, not TF32
    torch.set_float32_matmul_precision("highest")
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--models", default="qwen3-30b-a3b,deepseek-v2-lite,qwen3.5-35b-a3b,phi-3.5-moe,deepseek-v2,deepseek-v3")
    ap.add_argument("--tokens", default="2048,4096,8192")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--gpu-state", action="store_true", help="--bench: log the SM clock of each timing too")
    ap.add_argument("--virtual-only", action="store_true",
                    help="only the virtual-rank cases (small: for compute-sanitizer)")
    args = ap.parse_args()
    t0 = time.time()
    if not args.skip_tests:
        cases = [
            ("small", dict(hidden=256, inter=256, experts=8, top_k=2, tokens=[1, 37, 300], seed=1)),
            ("hidden 384 (a half-empty GEMM1 tile)", dict(hidden=384, inter=256, experts=4, top_k=2, tokens=[200], seed=2)),
            ("qwen3-30b-a3b dims", dict(hidden=2048, inter=768, experts=128, top_k=8, tokens=[512], seed=3)),
            ("deepseek-v2-lite dims", dict(hidden=2048, inter=1408, experts=64, top_k=6, tokens=[1000], seed=4)),
            ("deepseek-v3 dims, 32 experts", dict(hidden=7168, inter=2048, experts=32, top_k=8, tokens=[256], seed=5)),
        ]
        for name, kw in [] if args.virtual_only else cases:
            try:
                case_real(name, **kw)
            except Exception:  # noqa: BLE001 - every case reports
                traceback.print_exc()
                check(False, f"{name}: raised")
        try:
            if not args.virtual_only:
                case_shared("deepseek-v2-lite-like, FP8 shared expert", hidden=2048, inter=1408, experts=16, top_k=6,
                            shared_inter=2816, tokens=[1, 300], seed=7)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            check(False, "shared expert case: raised")
        virtual = [(w, dict(hidden=384, inter=256, experts=8, top_k=2, seed=10 + w, dispatch=d))
                   for d in ("threads", "bulk", "bulk:4", "bulk:1") for w in (2, 4)]  # bulk:1: one issuer, 48 slots
        # e4m3 rows of 7168 bytes (deepseek-v3's hidden): one bulk slot each (bf16 rows of that width go in pieces)
        virtual.append((2, dict(hidden=7168, inter=256, experts=4, top_k=2, seed=20, dispatch="bulk")))
        for world, kw in virtual:
            try:
                case_virtual(world, **kw)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                check(False, f"virtual G={world} {kw}: raised")
        try:
            if not args.virtual_only:
                refusals()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            check(False, "refusals: raised")
        log(f"SUMMARY: {len(FAILURES)} failures in {time.time() - t0:.0f} s")
    if args.bench and not FAILURES:
        rows = bench(args.models.split(","), [int(t) for t in args.tokens.split(",")], args.reps, args.gpu_state)
        log(f"{'model':18s} {'tokens':>6s} {'policy':8s} {'bf16 ms':>8s} {'(again)':>8s} {'fp8 ms':>8s} "
            f"{'bf16 TF/s':>9s} {'fp8 TF/s':>8s} {'bf16/fp8':>8s}")
        for r in rows:
            log(f"{r[0]:18s} {r[1]:6d} {r[2]:8s} {r[3]:8.3f} {r[4]:8.3f} {r[5]:8.3f} {r[6]:9.0f} {r[7]:8.0f} {r[8]:8.3f}")
        for pol in ("static:8", "weave"):
            sel = [r[8] for r in rows if r[2] == pol]
            if sel:
                log(f"geomean bf16 / fp8 under {pol}: {statistics.geometric_mean(sel):.3f}x over {len(sel)} layers")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
