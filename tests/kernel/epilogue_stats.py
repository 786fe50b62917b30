"""Epilogue share of the GEMM tiles inside a layer, from a Chrome trace of a kernel built with
tests/kernel/epilogue_timing.patch (the patch adds, per tile, a 'wait' record with row_block -7 - kind spanning
"both warpgroups' MMAs done" .. "outputs written and the tile signalled", and one with -20 - kind spanning
"this warpgroup's MMAs done" .. "both done"). How it was run (docs/kernel.md, "The SwiGLU division"):

    mkdir -p DIR && cp weave_kernel/csrc/* DIR && patch -d DIR -p3 < tests/kernel/epilogue_timing.patch; export WEAVE_KERNEL_CSRC=$PWD/DIR
    torchrun --nproc_per_node=1 -m weave_kernel.bench --models qwen3-30b-a3b --tokens 4096 --comm 20 --weave-comm= \
        --no-sequential --repeats 2 --trace t.json --trace-policy weave
    python tests/kernel/epilogue_stats.py [--by-next-tile] t.json [t2.json ...]
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

KIND = {2: "gemm0", 3: "gemm1"}
# row_block -10 s - kind of a copy that also stamps the GEMM0 epilogue's steps (tests/kernel/epilogue_steps.patch;
# docs/kernel.md "A GEMM0 tile's epilogue at decode sizes"): s = 3 SwiGLU and staging, 4 the stores, 5 the fence,
# 6 the signal and the records; 7 a second staging pass (docs/results/epilogue_decode/staging_twice/); a GEMM1 tile's
# two 128-column halves: 3 and 4 the first half's staging and stores, 8 and 9 the second's, 6 the rest
STEPS = {3: "staging", 4: "stores", 5: "fence", 6: "signal", 7: "staging again", 8: "staging 2", 9: "stores 2"}


def _step(e: dict):
    """(kind, step) of a step record of the stamping patches, else None."""
    rb = e.get("args", {}).get("row_block")
    if e["name"] == "wait" and rb is not None and (-rb) // 10 in STEPS and (-rb) % 10 in KIND:
        return KIND[(-rb) % 10], STEPS[(-rb) // 10]
    return None


def epilogue_stats(path: str) -> dict:
    doc = json.load(open(path))
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise SystemExit(f"{path}: not a Chrome trace (no traceEvents); pass the file of bench --trace")
    events = doc["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    tiles, epi, skew = defaultdict(list), defaultdict(list), defaultdict(list)
    steps = defaultdict(list)  # (kind, step): the finer records of a copy that stamps the epilogue's steps
    for e in spans:
        rb = e.get("args", {}).get("row_block")
        step = _step(e)
        if step is not None:
            steps[step].append(e["dur"])
        if e["name"] in KIND.values():
            tiles[e["name"]].append(e["dur"])
        elif e["name"] == "wait" and rb is not None and -7 - 3 <= rb <= -7 - 2:
            epi[KIND[-7 - rb]].append(e["dur"])
        elif e["name"] == "wait" and rb is not None and -20 - 3 <= rb <= -20 - 2:
            skew[KIND[-20 - rb]].append(e["dur"])
    t0, t1 = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    sm_time = (t1 - t0) * len({(e["pid"], e["tid"]) for e in spans})
    out = {"span_us": t1 - t0, "epilogue_share_of_sm_time": sum(map(sum, epi.values())) / sm_time}
    for k in tiles:
        out[k] = {"tiles": len(tiles[k]), "tile_median_us": statistics.median(tiles[k]),
                  "epilogue_median_us": statistics.median(epi[k]) if epi[k] else None,
                  "epilogue_share_of_tile_time": sum(epi[k]) / sum(tiles[k]) if epi[k] else None,
                  "warpgroup_skew_median_us": statistics.median(skew[k]) if skew[k] else None,
                  "steps_median_us": {st: statistics.median(v) for (kk, st), v in steps.items() if kk == k}}
    return out


def steps_by_next_tile(path: str, near_us: float = 1.0) -> dict:
    """The step records again, split by what the same CTA does next: 'next' when its next tile starts within
    `near_us` of this one's end (its producer was loading that tile's stages during this epilogue), 'last' when no
    tile follows in the trace, 'later' otherwise. {(kind, step, class): (median us, records), ...}. docs/kernel.md "GEMM1
    row addresses computed once per tile" used it to see how much of the store time the producer's concurrent loads
    take."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    per_cta = defaultdict(list)
    for e in events:
        per_cta[(e["pid"], e["tid"])].append(e)
    out = defaultdict(list)
    for evs in per_cta.values():
        tiles = sorted((e for e in evs if e["name"] in KIND.values()), key=lambda e: e["ts"])
        for e in evs:
            step = _step(e)
            if step is None:
                continue
            i = next((i for i, t in enumerate(tiles) if t["ts"] <= e["ts"] <= t["ts"] + t["dur"] + 1e-3), None)
            if i is None:
                continue
            end = tiles[i]["ts"] + tiles[i]["dur"]
            cls = "last" if i + 1 == len(tiles) else "next" if tiles[i + 1]["ts"] - end < near_us else "later"
            out[step + (cls,)].append(e["dur"])
    return {k: (statistics.median(v), len(v)) for k, v in sorted(out.items())}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    by_next = "--by-next-tile" in argv
    argv = [a for a in argv if a != "--by-next-tile"]
    for path in argv:
        s = epilogue_stats(path)
        print(f"{path}: span {s['span_us']:.0f} us, epilogues {s['epilogue_share_of_sm_time']:.1%} of SM time")
        for k in ("gemm0", "gemm1"):
            if k in s and s[k]["epilogue_median_us"] is not None:
                v = s[k]
                print(f"  {k}: {v['tiles']} tiles, median {v['tile_median_us']:.1f} us, epilogue median "
                      f"{v['epilogue_median_us']:.2f} us ({v['epilogue_share_of_tile_time']:.1%} of tile time)"
                      + (f", warpgroup skew median {v['warpgroup_skew_median_us']:.2f} us"
                         if v["warpgroup_skew_median_us"] is not None else ""))
                if v["steps_median_us"]:
                    print("    steps (median us): " + ", ".join(f"{st} {us:.2f}" for st, us in v["steps_median_us"].items()))
        if by_next:  # the steps split by what the CTA does next (steps_by_next_tile)
            for (kind, step, cls), (us, n) in steps_by_next_tile(path).items():
                print(f"    {kind} {step}, {cls}: median {us:.2f} us over {n} tiles")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
