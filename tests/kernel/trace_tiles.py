"""Per-tile GEMM rate inside the megakernel, from a Chrome trace written by `python -m weave_kernel.bench --trace`:
median span of the GEMM0 / GEMM1 tile records (claim-to-epilogue-end on the tile's CTA, waits excluded) and the
TF/s per SM that span means. Usage: python tests/kernel/trace_tiles.py TRACE.json H I [TRACE.json H I ...]"""
from __future__ import annotations

import json
import statistics
import sys


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


def main(argv: list[str]) -> int:
    if len(argv) % 3 or not argv:
        print(__doc__)
        return 2
    for i in range(0, len(argv), 3):
        stats = tile_stats(argv[i], int(argv[i + 1]), int(argv[i + 2]))
        for name, (n, med, rate) in stats.items():
            print(f"{argv[i]}  {name}: {n} tiles, median {med:.2f} us, {rate:.2f} TF/s per SM")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
