"""Merge kernel benchmark files (python -m weave_kernel.bench) into one, for a fit to several runs at once
(weave-sim calibrate --fit takes one file): the results of every file in order, each naming its kernel's deciders
as the file it came from dates them (weave_sim.validate.bench_results), under a header that names the inputs.
The first file's config and kernel sources stand for the merge; config.merged_from lists every input.

    python tests/kernel/merge_bench.py OUT.json A.json B.json [...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from weave_sim.jsonfile import read_json
from weave_sim.validate import bench_results


def merge(paths: list[str]) -> dict:
    if len(paths) < 2:
        raise ValueError("merge needs at least two benchmark files")
    docs = []
    for p in paths:
        d = read_json(p, "kernel benchmark results")
        if not isinstance(d, dict) or not isinstance(d.get("results"), list) or not d["results"]:
            raise ValueError(f"{p} is not a kernel benchmark file with results")
        docs.append(d)
    out = dict(docs[0])
    out["results"] = [r for d in docs for r in bench_results(d)]
    out["config"] = {**(docs[0].get("config") or {}), "merged_from": list(paths)}
    out["header"] = "merged results of " + "; ".join(f"{p} ({d.get('header', 'no header')})"
                                                      for p, d in zip(paths, docs))
    for key in ("weave_geomeans", "geomean_speedup_best_static"):  # per-file summaries: not of the merge
        out.pop(key, None)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        doc = merge(argv[1:])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(json.dumps(doc))
    print(f"wrote {argv[0]}: {len(doc['results'])} results from {len(argv) - 1} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
