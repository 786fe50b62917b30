"""Per-piece dispatch cost from measured traces (CPU only, no torch): every `dispatch` record of a megakernel trace
matched to its piece, and the piece's rows rebuilt from the benchmark's routing.

The megakernel's comm CTA k of C pushes its rank's pieces k, k + C, k + 2C, ... in sending order (csrc
megakernel.cuh dispatch_blocks); a piece is a source's rows of one expert inside one 128-row block of the owner's
receive layout (weave_sim.engine.rows.piece_layout). A record names its SM and the piece's destination and owner
row block, which identify the piece; that every SM's pieces are i, i + C, i + 2C, ... checks the rebuilt routing
and the deal. A least-squares line  duration = fixed + bytes / rate  over each trace's pieces, and one over all
traces with a shared fixed cost and a rate per trace, give a piece's fixed cost (fence, flag, the copy's start and
end) and the per-CTA copy rate while that trace's C CTAs push at once.

    python -m weave_kernel.piece_cost docs/results/kernel_trace_weave_*_4096.json [--seed 0 --zipf 1.0] [--out F]

The routing is rebuilt from the trace's metadata (model, tokens per GPU) and the benchmark's seed and Zipf
exponent (`bench --trace` with the default per-rank draw; weave_kernel.recount), so traces of per-layer routing
(`--synthetic`, `--routing-trace`) are not supported. `--out` writes the per-trace lines and, over all pieces of
all traces, one line fit: its "dispatch_piece_ns" is what `weave-sim calibrate --piece-cost FILE` charges each
dispatch piece (fixed_ns.dispatch_piece; docs/calibration.md).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from weave_sim.engine.rows import piece_layout, receive_ring
from weave_sim.placement import contiguous
from weave_sim.presets import get_model
from weave_sim.validate import result_placement
from weave_sim.workload import workload_from_counts

from .recount import counts_for

TILE = 128


def piece_table(counts: dict, model, G: int, placement=None) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """(rows, owner row block) of every piece per stream s -> d in the kernel's sending order: the engine's
    piece_layout of the expert-packed layout, each expert's blocks offset by the blocks of the experts before it
    (an expert's rows are padded once to whole blocks). placement: the expert -> rank map (default contiguous)."""
    w = workload_from_counts(counts["source_expert_pairs"], counts["dispatch_rows"], model,
                             placement or contiguous(model.num_experts, G), counts["tokens_per_gpu"])
    layout = piece_layout(w, receive_ring(G, "piece"), TILE, None)
    out = [[(np.zeros(0, np.int64), np.zeros(0, np.int64)) for _ in range(G)] for _ in range(G)]
    for d in range(G):
        blocks = -(-w.pair_counts[:, d, w.placement.local_experts(d)].sum(axis=0) // TILE)
        first_block = np.cumsum(blocks) - blocks
        for s in range(G):
            rows, expert, blk = layout[s][d]
            if s != d:
                out[s][d] = (rows, first_block[expert] + blk)
    return out


def analyse(path: Path, seed: int, zipf: float) -> dict:
    doc = json.loads(path.read_text())
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list) or not meta \
            or "model" not in meta or "tokens_per_gpu" not in meta:
        raise ValueError(f"{path}: not a megakernel trace of bench --trace (needs traceEvents and metadata with "
                         "model and tokens_per_gpu)")
    model = get_model(meta["model"])
    n = int(meta["tokens_per_gpu"])
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    G = max(int(e["pid"]) for e in ev) + 1
    res = {"gpus": G, "tokens_per_gpu": n, "experts": model.num_experts, "top_k": model.top_k,
           "model": model.name, "hidden": model.hidden_size, "inter": model.expert_ffn_size,
           "placement_owner": meta.get("placement_owner")}  # bench --placement: the map the trace ran with
    counts = counts_for(res, {"seed": seed, "zipf": zipf})
    table = piece_table(counts, model, G, result_placement(res))
    rows_all, dur_all, mismatched, matched = [], [], 0, 0
    per_gpu = {}
    for s in range(G):
        disp = [e for e in ev if e["name"] == "dispatch" and int(e["pid"]) == s]
        if not disp:
            continue
        # records name the SM (tid), not the CTA index: a piece is found by its (destination, owner row block),
        # unique within a stream; the round-robin deal is then checked: a CTA's pieces are i, i + C, i + 2C, ...
        C = len({int(e["tid"]) for e in disp})
        order = [(int(r), int(b), d) for step in range(1, G) for d in [(s + step) % G] for r, b in zip(*table[s][d])]
        index = {(d, b): i for i, (_, b, d) in enumerate(order)}
        by_cta: dict[int, list] = {}
        for e in disp:
            i = index.get((int(e["args"]["col_block_or_rank"]), int(e["args"]["row_block"])))
            if i is None:
                mismatched += 1
                continue
            matched += 1
            rows_all.append(order[i][0])
            dur_all.append(float(e["dur"]))
            by_cta.setdefault(int(e["tid"]), []).append((float(e["ts"]), i))
        dealt = all(all(b - a == C for a, b in zip(ix, ix[1:])) for ix in
                    ([i for _, i in sorted(v)] for v in by_cta.values()))
        per_gpu[s] = {"comm_ctas": C, "pieces": len(order), "records": len(disp), "round_robin": dealt}
    if mismatched or not matched:
        raise ValueError(f"{path}: {mismatched} of {matched + mismatched} dispatch records match no rebuilt piece "
                         "(another routing, seed or layout?)")
    rows, dur = np.array(rows_all), np.array(dur_all)
    nbytes = rows * model.hidden_size * 2
    full = rows == TILE
    return {"trace": path.name, "model": model.name, "tokens": n, "per_gpu": per_gpu, "matched": matched,
            "mismatched": mismatched, **line_fit(nbytes, dur),
            "full_piece_us": float(np.median(dur[full])) if full.any() else None,
            "rows_median": float(np.median(rows)), "bytes": nbytes.tolist(), "dur_us": dur.tolist()}


def joint_fit(nbytes: list, dur_us: list) -> dict:
    """One fixed cost shared by every trace, one copy rate per trace (its C comm CTAs share the link their own way):
    least squares  dur = fixed + bytes / rate_t ; fixed_us, cta_gbs per trace, rms residual."""
    T = len(nbytes)
    cols = [np.concatenate([np.ones(len(b)) for b in nbytes])]
    for t in range(T):
        cols.append(np.concatenate([np.asarray(b, dtype=float) / 1e6 if u == t else np.zeros(len(b))
                                    for u, b in enumerate(nbytes)]))
    A, y = np.stack(cols, axis=1), np.concatenate([np.asarray(d, dtype=float) for d in dur_us])
    x, *_ = np.linalg.lstsq(A, y, rcond=None)
    return {"fixed_us": float(x[0]), "cta_gbs": [float(1e3 / v) if v > 0 else None for v in x[1:]],
            "resid_rms_us": float(np.sqrt(np.mean((A @ x - y) ** 2)))}


def line_fit(nbytes, dur_us) -> dict:
    """Least squares  dur = fixed + bytes / rate : fixed_us, cta_gbs and the rms residual."""
    dur_us = np.asarray(dur_us, dtype=float)
    A = np.stack([np.ones(len(nbytes)), np.asarray(nbytes, dtype=float) / 1e6], axis=1)
    (fixed_us, us_per_mb), *_ = np.linalg.lstsq(A, dur_us, rcond=None)
    rms = float(np.sqrt(np.mean((A @ np.array([fixed_us, us_per_mb]) - dur_us) ** 2)))
    return {"fixed_us": float(fixed_us), "cta_gbs": float(1e3 / us_per_mb) if us_per_mb > 0 else None,
            "resid_rms_us": rms}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, nargs="+", help="Chrome traces of bench --trace (megakernel runs)")
    ap.add_argument("--seed", type=int, default=0, help="the benchmark's routing seed (default %(default)s)")
    ap.add_argument("--zipf", type=float, default=1.0, help="the benchmark's Zipf exponent (default %(default)s)")
    ap.add_argument("--out", type=Path, default=None, help="write the fits as JSON")
    a = ap.parse_args(argv)
    results = []
    for t in a.traces:
        try:
            results.append(analyse(t, a.seed, a.zipf))
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
            detail = str(exc) if str(t) in str(exc) else f"{t}: {exc}"
            ap.error(f"cannot use the traces: {detail}")
    print(f"{'trace':44} {'C':>7} {'pieces':>7} {'matched':>8} {'dealt':>6} {'rows med':>9} {'full us':>8} "
          f"{'fixed us':>9} {'GB/s/CTA':>9} {'rms us':>7}")
    for r in results:
        cs = "/".join(str(g["comm_ctas"]) for g in r["per_gpu"].values())
        print(f"{r['trace']:44} {cs:>7} {sum(g['pieces'] for g in r['per_gpu'].values()):>7} "
              f"{r['matched']:>4}/{r['matched'] + r['mismatched']:<3} "
              f"{'rr' if all(g['round_robin'] for g in r['per_gpu'].values()) else 'other':>6} {r['rows_median']:>9.0f} "
              f"{(r['full_piece_us'] or float('nan')):>8.1f} {r['fixed_us']:>9.2f} {r['cta_gbs'] or float('nan'):>9.2f} "
              f"{r['resid_rms_us']:>7.2f}")
    every = joint_fit([r["bytes"] for r in results], [r["dur_us"] for r in results])
    print(f"all {sum(r['matched'] for r in results)} pieces, one fixed cost and a rate per trace: fixed "
          f"{every['fixed_us']:.2f} us per piece, " + ", ".join(f"{g:.2f}" for g in every["cta_gbs"])
          + f" GB/s per CTA (rms {every['resid_rms_us']:.2f} us)")
    if a.out:
        a.out.write_text(json.dumps({
            "dispatch_piece_ns": round(every["fixed_us"] * 1e3, 1), "all": every, "seed": a.seed, "zipf": a.zipf,
            "traces": [{k: v for k, v in r.items() if k not in ("bytes", "dur_us")} for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
