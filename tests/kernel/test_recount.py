import json

import numpy as np
import pytest

from weave_kernel.recount import counts_for, main
from weave_kernel.routing import skewed_routing


def test_counts_match_the_benchmark_routing():
    r = {"gpus": 2, "tokens_per_gpu": 96, "experts": 8, "top_k": 2}
    c = counts_for(r, {"seed": 0, "zipf": 1.0})
    pairs = np.array(c["source_expert_pairs"])
    assert pairs.shape == (2, 8) and (pairs.sum(axis=1) == 96 * 2).all()
    ids1, _ = skewed_routing(96, 8, 2, seed=1 * 7 + 96, zipf_s=1.0)  # rank 1's seed in the benchmark
    assert (pairs[1] == np.bincount(ids1.ravel(), minlength=8)).all()
    rows = np.array(c["dispatch_rows"])  # pairs per (source, destination): experts 0-3 on GPU 0, 4-7 on GPU 1
    assert (rows[:, 0] == pairs[:, :4].sum(axis=1)).all() and (rows[:, 1] == pairs[:, 4:].sum(axis=1)).all()


def test_cli_adds_counts_and_refuses_what_it_cannot_read(tmp_path, capsys):
    """A file without counts gets them; a missing, non-JSON or non-benchmark file is a usage line, no traceback."""
    src, dst = tmp_path / "old.json", tmp_path / "new.json"
    src.write_text(json.dumps({"config": {"seed": 0, "zipf": 1.0},
                               "results": [{"gpus": 2, "tokens_per_gpu": 96, "experts": 8, "top_k": 2}]}))
    assert main([str(src), str(dst)]) == 0
    assert json.loads(dst.read_text())["results"][0]["counts"]["dispatch_rows_kind"] == "pairs"
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "calib.json").write_text(json.dumps({"gemm": []}))
    (tmp_path / "partial.json").write_text(json.dumps({"results": [{"model": "m"}]}))
    for name, words in [("missing.json", "cannot read kernel benchmark results"), ("text.json", "cannot read"),
                        ("calib.json", "is not a kernel benchmark file"),
                        ("partial.json", "cannot rebuild the counts")]:
        with pytest.raises(SystemExit):
            main([str(tmp_path / name), str(dst)])
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, name
