"""Where the weave choice's time goes inside the megakernel (one GPU, EP=1): a copy of the kernel sources whose
choose_split_parallel stamps %globaltimer between its steps (thread 0 of every CTA), recorded as extra `choose`
timeline records, against the same choice timed by itself (tests/kernel/choice_timing.py: 3.6-4.7 us, while the
megakernel's `choose` record spans 8-10 us).

With the choice run twice (one copy of its code in a loop; `twice` rows), `first` is the first call whole and the
steps are the second's, whose instructions are already fetched.

Steps: volumes (each thread's experts), sums (warp shuffles, barrier), totals (the block sum and the volumes),
argmin (this thread's share of the c x K grid), best (warp shuffles, barrier), pick (the block's best). The patch
is anchored (the script stops if an anchor is gone); the shipped sources are not touched. Every call is checked
against the fp32 reference (rel. error <= 1e-2). Prints per model the median over CTAs and calls of each step, us.

    python tests/kernel/choice_steps.py [--models qwen3-30b-a3b,deepseek-v3] [--tokens 128,4096] [--calls 5]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

STEPS = ("volumes", "sums", "totals", "argmin", "best", "pick")
TOL = 1e-2

# choice.cuh: (anchor, text inserted after it); stamps st[i] by thread 0
_STAMP = "  if (st != nullptr && threadIdx.x == 0) asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(st[{i}]));\n"
CHOICE_ANCHORS = (
    ("  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;\n", 0),
    ("    accumulate_expert(a, rows, cnt[rank * num_experts + e], __ldg(owner + e) == rank, tile_rows);\n  }\n", 1),
    ("  if (lane == 0) red_sums[warp] = a;\n  __syncthreads();\n", 2),
    ("  const CostVolumes v = volumes_from_sums(table, tot, hidden, ffn);\n", 3),
    ("  GridBest best = grid_slice_best(table, v, c_min, c_max, tid, kThreads);\n", 4),
    ("  if (lane == 0) red_best[warp] = best;\n  __syncthreads();\n", 5),
    ("    if (grid_better(red_best[w], best)) best = red_best[w];\n", 6),
)
CHOICE_SIG = "int ffn, VolumeSums* red_sums, GridBest* red_best) {"
MK_DECL = "  uint64_t tc = 0;\n"
MK_CALL = "p.hidden, p.inter, s.red_sums, s.red_best);"
MK_CALL_FULL = ("    const CostChoice c = choose_split_parallel<Config::kThreads>(s.cost_table, s.cnt, p.expert_owner, "
                "p.rank, G, E,\n                                                                 p.hidden, p.inter, "
                "s.red_sums, s.red_best, cst);\n")
MK_RECORD = "  if (decide) tl_record(p, s, tc, role, kTaskChoose, choice_c, choice_k);\n"


def _replace_once(text: str, anchor: str, new: str, name: str) -> str:
    if text.count(anchor) != 1:
        raise SystemExit(f"{name} changed: the anchor {anchor.strip()[:60]!r} is gone; update choice_steps.py")
    return text.replace(anchor, new)


def patched_csrc(src: Path, root: Path, warm_call: bool = False) -> Path:
    """A copy of the kernel sources whose choice records its steps as `choose` records with arg0 = -2 - step.
    warm_call: the choice runs twice (one copy of its code, a loop), the first call recorded whole with arg0 = -20,
    the steps of the second (its instructions already fetched)."""
    dst = root / ("csrc_choice_steps_warm" if warm_call else "csrc_choice_steps")
    shutil.copytree(src, dst)
    ch = (dst / "choice.cuh").read_text()
    ch = _replace_once(ch, CHOICE_SIG, CHOICE_SIG[:-3] + ", unsigned long long* st = nullptr) {", "choice.cuh")
    for anchor, i in CHOICE_ANCHORS:
        ch = _replace_once(ch, anchor, anchor + _STAMP.format(i=i), "choice.cuh")
    (dst / "choice.cuh").write_text(ch)
    mk = (dst / "megakernel.cuh").read_text()
    mk = _replace_once(mk, MK_DECL, MK_DECL + "  unsigned long long cst[8] = {};\n", "megakernel.cuh")
    mk = _replace_once(mk, MK_CALL, MK_CALL[:-2] + ", cst);", "megakernel.cuh")
    spans = ("  if (decide)\n    for (int i = 0; i < 6; ++i)\n"
             "      tl_record_span(p, s, cst[i], cst[i + 1], role, kTaskChoose, -2 - i, 0);\n")
    mk = _replace_once(mk, MK_RECORD, MK_RECORD + spans, "megakernel.cuh")
    if warm_call:
        call = MK_CALL_FULL.replace("    const CostChoice c = ", "      c = ").replace(", cst);", ", rep ? cst : nullptr);")
        loop = ("    CostChoice c;\n#pragma unroll 1\n    for (int rep = 0; rep < 2; ++rep) {\n"
                "      const uint64_t r0 = globaltimer_ns();\n" + call +
                "      if (rep == 0) tl_record_span(p, s, r0, globaltimer_ns(), kRoleCompute, kTaskChoose, -20, 0);\n"
                "    }\n")
        mk = _replace_once(mk, MK_CALL_FULL, loop, "megakernel.cuh")
    (dst / "megakernel.cuh").write_text(mk)
    return dst


def step_durations(events: list[dict]) -> dict[str, list[float]]:
    """us per step (and 'whole': the unpatched `choose` record) from one call's Chrome events."""
    out: dict[str, list[float]] = {s: [] for s in ("whole", "first", *STEPS)}
    for e in events:
        if e.get("name") != "choose":
            continue
        a0 = e["args"].get("row_block")
        if a0 is None:
            out["whole"].append(e["dur"])
        elif a0 == -20:
            out["first"].append(e["dur"])
        elif -2 - len(STEPS) < a0 <= -2:
            out[STEPS[-2 - a0]].append(e["dur"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-30b-a3b,deepseek-v3")
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args(argv)
    import torch

    from weave_kernel.build import CSRC, load_extension
    from weave_kernel.megakernel import MoEMegakernel
    from weave_kernel.reference import make_weights, moe_reference
    from weave_kernel.routing import bench_routing
    from weave_sim.placement import contiguous
    from weave_sim.presets import get_model

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    root = Path(tempfile.mkdtemp(prefix="weave_choice_"))
    exts = {"once": load_extension(csrc=patched_csrc(CSRC, root)),
            "twice": load_extension(csrc=patched_csrc(CSRC, root, warm_call=True))}
    failures = []
    cols = ("whole", "first", *STEPS)
    print(f"{'model':<18}{'tokens':>7}{'choice':>7}" + "".join(f"{s:>9}" for s in cols) + "   (us, median)")
    for name in args.models.split(","):
        m = get_model(name)
        E, H, I, k = m.num_experts, m.hidden_size, m.expert_ffn_size, m.top_k
        w13, w2 = make_weights(E, H, I, device=dev, generator=torch.Generator(device=dev).manual_seed(7))
        for n in (int(t) for t in args.tokens.split(",")):
            ids, w = bench_routing(n, E, k, seed=0, rank=0)
            x = torch.randn(n, H, device=dev).to(torch.bfloat16)
            ids_d, w_d = torch.as_tensor(ids).to(dev), torch.as_tensor(w).to(dev)
            ref = moe_reference(x, ids_d, w_d, w13, w2)
            for variant, ext in exts.items():
                layer = MoEMegakernel(hidden=H, inter=I, num_experts=E, top_k=k, placement=contiguous(E, 1),
                                      max_tokens=n, ext=ext, timeline_per_cta=512)
                acc: dict[str, list[float]] = {}
                for _ in range(args.calls):
                    y = torch.full((n, H), float("nan"), dtype=torch.bfloat16, device=dev)
                    layer(x, ids_d, w_d, w13, w2, policy="weave", out=y, record_timeline=True)
                    torch.cuda.synchronize()
                    err = float((y.float() - ref).norm() / ref.norm())
                    if not err <= TOL:
                        failures.append(f"{name} {n} {variant}: rel_err {err:.2e}")
                    for s, v in step_durations(layer.timeline_events()[0]).items():
                        acc.setdefault(s, []).extend(v)
                layer.raise_if_error()
                med = {s: statistics.median(v) if v else float("nan") for s, v in acc.items()}
                print(f"{name:<18}{n:>7}{variant:>7}" + "".join(f"{med[s]:>9.2f}" for s in cols), flush=True)
                del layer
        torch.cuda.empty_cache()
    print(f"SUMMARY: {len(failures)} failures" + (": " + "; ".join(failures) if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
