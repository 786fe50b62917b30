"""The shared expert on the host side, without a GPU: geometry and weight checks, the reference, trace events,
the benchmark's flag."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from weave_kernel.geometry import check_geometry  # noqa: E402
from weave_kernel.reference import make_shared_weights, moe_reference, shared_ffn  # noqa: E402
from weave_kernel.timeline import KIND_NAMES, RECORD_DTYPE, records_to_events  # noqa: E402
from weave_kernel.validate import check_shared_weights  # noqa: E402


def test_geometry_takes_a_shared_width():
    check_geometry(256, 128, 8, 2, 2, 2, 0)
    check_geometry(256, 128, 8, 2, 2, 2, 2 * 128)
    for bad in (-64, 100, 131072 + 64):
        with pytest.raises(ValueError, match="shared expert's width"):
            check_geometry(256, 128, 8, 2, 2, 2, bad)


def test_shared_weights_are_checked():
    w13s, w2s = make_shared_weights(128, 192)
    assert tuple(w13s.shape) == (384, 128) and tuple(w2s.shape) == (128, 192)
    check_shared_weights(w13s, w2s, hidden=128, inter_shared=192, device="cpu")
    with pytest.raises(ValueError, match="w13s must have shape"):
        check_shared_weights(w2s, w13s, hidden=128, inter_shared=192)
    with pytest.raises(TypeError, match="w2s must have dtype"):
        check_shared_weights(w13s, w2s.float(), hidden=128, inter_shared=192)
    with pytest.raises(ValueError, match="contiguous"):
        check_shared_weights(w13s, w2s.t().contiguous().t(), hidden=128, inter_shared=192)


def test_reference_adds_the_shared_expert_with_weight_one():
    g = torch.Generator().manual_seed(0)
    n, h, i, e, k = 37, 64, 128, 4, 2
    x = torch.randn(n, h, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, e, (n, k), generator=g)
    w = torch.rand(n, k, generator=g)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(torch.bfloat16)
    sw = make_shared_weights(h, 192, generator=g)
    routed = moe_reference(x, ids, w, w13, w2)
    both = moe_reference(x, ids, w, w13, w2, shared=sw)
    xf = x.float()
    hh = xf @ sw[0].float().t()
    want = (torch.nn.functional.silu(hh[:, :192]) * hh[:, 192:]) @ sw[1].float().t()
    assert torch.allclose(both - routed, want, atol=1e-5, rtol=1e-4)
    assert torch.allclose(shared_ffn(xf, sw[0].float(), sw[1].float()), want, atol=1e-6)


def test_shared_tiles_are_gemm_events_marked_shared():
    rec = np.zeros(3, dtype=RECORD_DTYPE)
    rec["kind"] = [KIND_NAMES.index("gemm0"), KIND_NAMES.index("shared_gemm0"), KIND_NAMES.index("shared_gemm1")]
    rec["end_ns"] = 1000
    ev = records_to_events(rec, 0, 0)
    assert [e["name"] for e in ev] == ["gemm0", "gemm0", "gemm1"]
    assert [e["args"].get("shared") for e in ev] == [None, 1, 1]


def test_bench_shared_flag():
    from weave_kernel.bench import parse_args

    assert parse_args([]).shared == "off"
    assert parse_args(["--shared", "first"]).shared == "first"
    with pytest.raises(SystemExit):
        parse_args(["--shared", "middle"])
