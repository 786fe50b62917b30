"""GPU calibration microbenchmarks: the megakernel's own copy, tile, ticket and flag code (csrc/calib.cuh) timed
in isolation and written as the measurements JSON that `weave-sim calibrate` turns into a hardware profile
(format: weave_sim/calibrate.py; method and numbers: docs/calibration.md).

    torchrun --nproc_per_node=G -m weave_kernel.calibrate --out calib.json     # G >= 2 for nvlink_push
    weave-sim calibrate calib.json --base h200 -o h200-calibrated.json

- nvlink_push: each rank pushes blocks of 128 rows x 8 KB (hidden 4096, bf16) into its peers' symmetric buffers
  with the dispatch code (copy_rows, then a per-block release flag), all ranks at once after an in-kernel
  cross-GPU start flag; GB/s per GPU = bytes / (last CTA end - first CTA start) (%globaltimer), median over
  repeats, min over ranks. With one GPU there are no peers: no nvlink_push (`weave-sim calibrate` then refuses
  the file; everything else is measured).
- gemm: C_e = A_e B_e^T per expert (K = 2048, N = 4096) with the kernel's 128 x 256 wgmma tiles claimed in
  expert-major order from an atomic ticket by n CTAs; TFLOP/s of useful FLOPs (2 * rows * N * K per expert,
  padding rows of a partial tile not counted) from CUDA events, median over repeats, mean over ranks.
- chunks: the same kind of GEMM (16 experts x 1024 rows) split into K row chunks separated by the kernel's grid
  barrier inside one cooperative launch on all SMs (not K launches).
- task_claim_ns: all SMs claim tickets of one counter back to back (the kernel's claim sequence); mean per claim.
- signal_ns: release/acquire flag ping-pong between rank 0 and rank 1, round trip / 2 (one GPU: two CTAs
  signalling through its own memory, so no NVLink in it).
- hbm_gbs: torch device-to-device copy of 1 GiB, (bytes read + bytes written) / time.
- power: the gemm at 2048 rows per expert, sustained (back-to-back calls for a few seconds after 1.5 s idle,
  the last half timed) at several CTA counts, with the SM clock and board power nvidia-smi reports meanwhile
  (weave_kernel/gpu_state.py), then the all-SM run again with the last 64 and then all 128 rows of every
  128-row block of A zeroed (padding rows, as a partial block's are in the layer: "pad_points"), then a sustained
  1 GiB device copy likewise (its power per TB/s), and the board's power limit: where the GPU holds a power cap
  by lowering its clock, `weave-sim calibrate` fits the profile's power model to these points, padding's
  energy included (docs/calibration.md). Left out where nvidia-smi does not answer.
Every rank runs every GPU-local measurement at the same time; only rank 0 writes the file.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from .policies import dispatch_issuers

ROW_BYTES = 4096 * 2            # one token row: hidden 4096, bf16
BLOCK_ROWS = 128                # dispatch block = GEMM tile rows (csrc/config.cuh kBlockM)
GEMM_K, GEMM_N = 2048, 4096
TILE_N = 256                    # kBlockN
MAX_EXPERTS = 128               # caps the weight memory of the GEMM runs (128 x N x K bf16 = 2 GiB)
TIMEOUT_NS = 10_000_000_000     # every in-kernel wait gives up after this (then the error word is set)


@dataclass(frozen=True)
class Plan:
    """What one run measures (full or --quick)."""

    push_ctas: tuple[int, ...]
    push_blocks: int            # blocks of BLOCK_ROWS rows per launch and rank (1 MiB each)
    gemm_rows: tuple[int, ...]
    gemm_ctas: tuple[int, ...]  # 0 = all SMs
    gemm_tiles: int             # tiles per GEMM launch (experts chosen to match)
    chunk_counts: tuple[int, ...]
    chunk_experts: int
    chunk_rows: int
    claims_per_cta: int
    signal_rounds: int
    hbm_bytes: int
    repeats: int
    power_ctas: tuple[int, ...] = ()  # sustained GEMM runs with clock and power (0 = all SMs); () = none
    power_sustain_s: float = 3.0
    # the sustained all-SM GEMM again with the last z rows of every 128-row block of A zeroed, one run per z: the
    # power of MMAs on padding rows (weave_sim's power.pad_energy); () = none
    power_pad_rows: tuple[int, ...] = ()
    # tiles timed at several K (gemm_by_k: a tile's fixed cost, weave_sim's gemm.k_fixed), on few CTAs (no
    # contention, no clock drop) so that tile time = fixed + per-K time is read off cleanly; () = none
    k_values: tuple[int, ...] = ()
    k_rows: tuple[int, ...] = ()
    k_ctas: int = 16
    k_tiles: int = 1024


FULL = Plan(push_ctas=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), push_blocks=192,
            gemm_rows=(16, 32, 64, 128, 256, 512, 1024, 2048), gemm_ctas=(16, 32, 64, 96, 128, 0), gemm_tiles=2048,
            chunk_counts=(1, 2, 4, 8), chunk_experts=16, chunk_rows=1024, claims_per_cta=2000, signal_rounds=2000,
            hbm_bytes=1 << 30, repeats=5, power_ctas=(16, 33, 66, 99, 0), power_pad_rows=(64, 128),
            k_values=(512, 1024, 2048, 4096, 7168), k_rows=(2048, 256))
QUICK = Plan(push_ctas=(1, 8, 32), push_blocks=32, gemm_rows=(64, 512), gemm_ctas=(32, 0), gemm_tiles=256,
             chunk_counts=(1, 2), chunk_experts=4, chunk_rows=256, claims_per_cta=200, signal_rounds=200,
             hbm_bytes=1 << 28, repeats=2, k_values=(256, 512, 1024), k_rows=(256,), k_ctas=8, k_tiles=64)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("calib.json"), help="measurements JSON to write (rank 0)")
    ap.add_argument("--quick", action="store_true", help="few points, small sizes (tests; a few seconds)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per point (default 5, quick 2)")
    ap.add_argument("--dispatch", default="threads",
                    help="the push points' copy code: the megakernel's dispatch by all threads (default) or by bulk "
                         "copies (MoEMegakernel(dispatch=...); csrc/bulk_copy.cuh)")
    ap.add_argument("--commit", default=None,
                    help="commit to record (default: $WEAVE_COMMIT, else git rev-parse HEAD, else 'unknown')")
    args = ap.parse_args(argv)
    try:
        dispatch_issuers(args.dispatch)
    except ValueError as exc:
        ap.error(str(exc))
    if args.repeats is not None and not 1 <= args.repeats <= 100:
        ap.error("--repeats must lie in [1, 100]")
    return args


def plan_for(args: argparse.Namespace) -> Plan:
    base = QUICK if args.quick else FULL
    return base if args.repeats is None else replace(base, repeats=args.repeats)


def experts_for(rows: int, tiles: int, n: int = GEMM_N) -> int:
    """Experts that give about `tiles` output tiles at `rows` rows per expert (at least 1, at most MAX_EXPERTS)."""
    per_expert = -(-rows // BLOCK_ROWS) * (n // TILE_N)
    return max(1, min(MAX_EXPERTS, tiles // per_expert))


def useful_tflops(experts: int, rows: int, ms: float, n: int = GEMM_N, k: int = GEMM_K) -> float:
    return 2.0 * experts * rows * n * k / (ms * 1e9)


def span_ns(times: list[int], num_ctas: int) -> int:
    """Last end minus first start over the first num_ctas {start, end} pairs of a times buffer."""
    starts, ends = times[0:2 * num_ctas:2], times[1:2 * num_ctas:2]
    return max(ends) - min(starts)


def git_commit() -> str:
    """$WEAVE_COMMIT if set (a copied working tree, e.g. on a lent GPU machine, may carry stale git metadata:
    set it from the checkout the copy came from), else `git rev-parse HEAD`, else "unknown"."""
    env = os.environ.get("WEAVE_COMMIT", "").strip()
    if env:
        return env
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                           cwd=Path(__file__).resolve().parent)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def driver_version(torch) -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return f"unknown (CUDA runtime {torch.version.cuda})"


def assemble(header: dict, push: list[dict], gemm: list[dict], chunks: list[dict], *, task_claim_ns: float,
             signal_ns: float, hbm_gbs: float, power: dict | None = None, extra: dict | None = None,
             gemm_by_k: list[dict] | None = None) -> dict:
    """The measurements JSON (weave_sim/calibrate.py's format); push is left out when empty (one GPU)."""
    m = dict(header)
    if push:
        m["nvlink_push"] = push
    m["gemm"] = gemm
    if gemm_by_k:
        m["gemm_by_k"] = gemm_by_k
        m["gemm_k"] = GEMM_K  # the K of the "gemm" points, against which the tile's fixed share is stated
    m["chunks"] = chunks
    m["task_claim_ns"] = round(task_claim_ns, 1)
    m["signal_ns"] = round(signal_ns, 1)
    m["hbm_gbs"] = round(hbm_gbs, 1)
    m["gemm_peak_tflops"] = round(max(p["tflops"] for p in gemm), 1)
    if power:
        m["power"] = power
    if extra:
        m.update(extra)
    return m


def format_summary(m: dict) -> str:
    """Short tables of a measurements dictionary (what main prints)."""
    lines = [f"# calibration: {m['gpu_name']} x{m.get('world', 1)}, driver {m.get('driver', '?')}, {m['date']}, "
             f"commit {str(m.get('commit', '?'))[:12]}, {m['num_sms']} SMs"]
    push = m.get("nvlink_push", [])
    if push:
        peers = sorted({p["peers"] for p in push})
        lines.append("push GB/s per GPU (all ranks pushing)  " + "".join(f"{f'peers={q}':>10}" for q in peers)
                     + f"{'GB/s/CTA':>10}")
        for c in sorted({p["ctas"] for p in push}):
            row = {p["peers"]: p["gbs"] for p in push if p["ctas"] == c}
            lines.append(f"  {c:>4} CTAs{'':28}" + "".join(f"{row.get(q, float('nan')):>10.1f}" for q in peers)
                         + f"{min(row.values()) / c:>10.2f}")
    else:
        lines.append("push: not measured (one GPU, no peers)")
    ctas = sorted({p["ctas"] for p in m["gemm"]})
    lines.append("gemm TFLOP/s (useful) by rows/expert x CTAs " + "".join(f"{c:>8}" for c in ctas)
                 + f"{'TF/SM':>8}")
    for r in sorted({p["rows_per_expert"] for p in m["gemm"]}):
        row = {p["ctas"]: p["tflops"] for p in m["gemm"] if p["rows_per_expert"] == r}
        per_sm = statistics.median(row[c] / c for c in row)
        lines.append(f"  {r:>6} rows{'':33}" + "".join(f"{row.get(c, float('nan')):>8.1f}" for c in ctas)
                     + f"{per_sm:>8.2f}")
    if m.get("gemm_by_k"):
        from weave_sim.calibrate import CalibrationError, gemm_k_fixed

        ks = sorted({p["k"] for p in m["gemm_by_k"]})
        lines.append("tile us by K (" + ", ".join(sorted({f"{p['rows_per_expert']} rows, {p['ctas']} CTAs"
                                                          for p in m["gemm_by_k"]})) + ")  "
                     + "".join(f"{f'K={k}':>9}" for k in ks))
        for key in sorted({(p["rows_per_expert"], p["ctas"]) for p in m["gemm_by_k"]}, reverse=True):
            row = {p["k"]: p["tile_us"] for p in m["gemm_by_k"] if (p["rows_per_expert"], p["ctas"]) == key}
            lines.append(f"  {key[0]:>6} rows{'':30}" + "".join(f"{row.get(k, float('nan')):>9.2f}" for k in ks))
        try:
            kf = gemm_k_fixed(m)
            lines.append(f"  fixed {kf['fixed_us']:.2f} us per tile + {kf['us_per_k'] * 1e3:.2f} us per 1k K: "
                         f"{100 * kf['share']:.1f}% of a tile at K={kf['k']}")
        except CalibrationError as exc:
            lines.append(f"  no fixed share: {exc}")
    t1 = next(p["time_ns"] for p in m["chunks"] if p["chunks"] == 1)
    lines.append("chunks K: time us (eff) " + ", ".join(
        f"{p['chunks']}: {p['time_ns'] / 1e3:.1f} ({min(1.0, t1 / p['time_ns']):.3f})" for p in m["chunks"]))
    lines.append(f"task_claim {m['task_claim_ns']:.0f} ns, signal {m['signal_ns']:.0f} ns, "
                 f"hbm {m['hbm_gbs']:.0f} GB/s, gemm peak {m['gemm_peak_tflops']:.0f} TF/s")
    pw = m.get("power")
    if pw:
        lines.append(f"sustained gemm (power limit {pw.get('limit_w', '?')} W): " + ", ".join(
            f"{p['ctas']}: {p['tflops']:.0f} TF/s at {p['sm_mhz']:.0f} MHz {p['power_w']:.0f} W" for p in pw["points"])
            + (f"; HBM copy {pw['hbm']['tbs']:.2f} TB/s {pw['hbm']['power_w']:.0f} W" if pw.get("hbm") else ""))
        if pw.get("pad_points"):
            lines.append("sustained gemm, zero rows in A (of 128 per block): " + ", ".join(
                f"{p['pad_rows']}: {p['tflops']:.0f} TF/s at {p['sm_mhz']:.0f} MHz {p['power_w']:.0f} W"
                for p in pw["pad_points"]))
    lines += [f"CHECK FAILED: {msg}" for msg in m.get("failed_checks", [])]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    plan = plan_for(args)
    from .calib_runs import Bench

    bench = Bench.start()
    bench.dispatch = args.dispatch
    try:
        m = bench.run(plan, commit=args.commit or git_commit())
        if bench.rank == 0:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(m, indent=1))
            print(format_summary(m))
            print(f"wrote {args.out}")
    finally:
        bench.close()
    return 1 if m.get("failed_checks") else 0


def today_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


if __name__ == "__main__":
    raise SystemExit(main())
