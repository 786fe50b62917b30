"""Per-tile GEMM rate inside the megakernel, from a Chrome trace written by `python -m weave_kernel.bench --trace`:
median span of the GEMM0 / GEMM1 tile records (claim-to-epilogue-end on the tile's CTA, waits excluded) and the
TF/s per SM that span means, and the median span by the kind of tile the same CTA ran before it (a tile that
finishes its predecessor's work, e.g. a deferred epilogue's stores, is slower after that kind).
Usage: python tests/kernel/trace_tiles.py TRACE.json H I [TRACE.json H I ...]"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

TILES = ("gemm0", "gemm1")


def tile_stats(path: str, hidden: int, inter: int) -> dict:
    doc = json.load(open(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    out = {}
    for name, k in (("gemm0", hidden), ("gemm1", inter)):
        spans = [e["dur"] for e in events if e.get("ph") == "X" and e.get("name") == name]
        if spans:
            med = statistics.median(spans)
            out[name] = (len(spans), med, 2 * 128 * 256 * k / med / 1e6)  # dur in us -> TF/s
    return out


def tiles_after(path: str) -> dict:
    """{(previous kind, kind): (tiles, median span in us)} over consecutive GEMM tiles of one CTA's track."""
    doc = json.load(open(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    tracks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("name") in TILES:
            tracks[(e.get("pid"), e.get("tid"))].append(e)
    spans = defaultdict(list)
    for track in tracks.values():
        track.sort(key=lambda e: e["ts"])
        for a, b in zip(track, track[1:]):
            spans[(a["name"], b["name"])].append(b["dur"])
    return {k: (len(v), statistics.median(v)) for k, v in sorted(spans.items())}


def main(argv: list[str]) -> int:
    if len(argv) % 3 or not argv:
        print(__doc__)
        return 2
    for i in range(0, len(argv), 3):
        stats = tile_stats(argv[i], int(argv[i + 1]), int(argv[i + 2]))
        for name, (n, med, rate) in stats.items():
            print(f"{argv[i]}  {name}: {n} tiles, median {med:.2f} us, {rate:.2f} TF/s per SM")
        for (prev, name), (n, med) in tiles_after(argv[i]).items():
            print(f"{argv[i]}  {name} after {prev}: {n} tiles, median {med:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
