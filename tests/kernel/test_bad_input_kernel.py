"""Bad input to the kernel package's CPU-reachable entry points gets a clear error (ValueError, or argparse's
exit 2 with a message), not a traceback, a hang or a silently wrong number."""
import math

import pytest
import torch

from weave_kernel import gap, predict, whatif
from weave_kernel.buffers import workspace_bytes
from weave_kernel.reference import ep_moe_reference, make_weights, moe_reference

GEO = dict(hidden=256, inter=128, num_experts=8, top_k=2, world=2, max_tokens=64)


@pytest.mark.parametrize("change, match", [
    (dict(world=0), "world must be an integer >= 1"),
    (dict(hidden=-256), "hidden must be an integer >= 1"),
    (dict(top_k=-2), "top_k must be an integer >= 1"),
    (dict(hidden=256.5), "hidden must be an integer"),
    (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
    (dict(shared_inter=-64), "shared_inter must be an integer >= 0"),
    (dict(num_experts=6, world=4), "multiple of the world size"),
    (dict(hidden=100), "multiples of 64"),
    (dict(num_ctas=1), "num_ctas"),
    (dict(max_tokens=2**30), "32-bit indices"),            # pair ids: max_tokens x top_k
    (dict(max_tokens=2**29, world=2, top_k=2), "32-bit indices"),  # receive rows: world x max_tokens x top_k
])
def test_workspace_bytes_refuses_what_the_kernel_would(change, match):
    assert workspace_bytes(**GEO)["total"] > 0
    with pytest.raises(ValueError, match=match):
        workspace_bytes(**{**GEO, **change})


def test_workspace_bytes_takes_the_largest_32_bit_layer():
    # receive rows: the worst case plus each local expert's padding, rounded up to whole row blocks of 128
    assert workspace_bytes(**{**GEO, "world": 1, "num_experts": 1, "top_k": 1, "max_tokens": 2**31 - 255})["total"] > 0
    with pytest.raises(ValueError, match="32-bit"):
        workspace_bytes(**{**GEO, "world": 1, "num_experts": 1, "top_k": 1, "max_tokens": 2**31 - 254})


def _layer(n=5, e=4, k=2, h=64, i=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)])
    w = torch.rand(n, k, generator=g)
    w13, w2 = make_weights(e, h, i, dtype=torch.float32)
    return x, ids, w, w13, w2


def test_reference_refuses_negative_and_out_of_range_ids():
    x, ids, w, w13, w2 = _layer()
    moe_reference(x, ids, w, w13, w2)  # fine as given
    for bad in (-1, 4):
        ids2 = ids.clone()
        ids2[2, 1] = bad
        with pytest.raises(ValueError, match=r"expert ids must lie in \[0, 4\)"):
            moe_reference(x, ids2, w, w13, w2)
        owner, local = torch.zeros(4, dtype=torch.int64), torch.arange(4)
        with pytest.raises(ValueError, match=r"expert ids must lie in \[0, 4\)"):
            ep_moe_reference(x, ids2, w, w13, w2, owner, local)


def test_reference_refuses_mismatched_shapes():
    x, ids, w, w13, w2 = _layer()
    with pytest.raises(ValueError, match=r"must both be \[5, top_k\]"):
        moe_reference(x, ids[:4], w[:4], w13, w2)
    with pytest.raises(ValueError, match=r"must both be \[5, top_k\]"):
        moe_reference(x, ids, w[:, :1], w13, w2)
    with pytest.raises(ValueError, match="integer tensor"):
        moe_reference(x, ids.float(), w, w13, w2)


@pytest.mark.parametrize("text", ["gemm:inf", "push:nan", "fp8:inf", "energy:-1", "decide:1e30", "piece:2e9"])
def test_whatif_refuses_non_finite_or_huge_factors(text):
    with pytest.raises(ValueError, match=text.split(":")[0]):
        whatif.parse_variants(text)


def test_whatif_accepts_its_documented_forms():
    assert whatif.parse_variants("gemm:1.2+push:2") == [("gemm", 1.2), ("push", 2.0)]
    assert whatif.parse_variants("piece:0") == [("piece", 0.0)]


@pytest.mark.parametrize("value", ["nan", "inf", "1e-300", "0"])
def test_gap_refuses_a_tile_rate_outside_reason(value, capsys):
    with pytest.raises(SystemExit) as exc:
        gap.main(["docs/results/kernel_bench_2xh200_static.json", "--tile-tflops", value])
    assert exc.value.code == 2 and "--tile-tflops must be" in capsys.readouterr().err


def test_gap_on_a_layout_it_cannot_model_is_an_error_not_a_traceback(capsys):
    with pytest.raises(SystemExit) as exc:
        gap.main(["docs/results/kernel_bench_2xh200_static.json", "--tokens", "2048"])
    assert exc.value.code == 2 and "expert-packed kernel layout" in capsys.readouterr().err


@pytest.mark.parametrize("args, match", [
    (["--gemm-scale", "nan"], "--gemm-scale must be a finite number > 0"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--synthetic", "zipf", "-p", "s=-1"], "Zipf exponent s must be >= 0"),
])
def test_predict_refuses_bad_arguments_with_one_message(args, match, capsys):
    base = ["--jobs", "1", "--models", "custom:E=8:k=2:H=256:I=256", "--gpus", "2", "--tokens", "64"]
    with pytest.raises(SystemExit) as exc:
        predict.main(base + args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and match in err and "Traceback" not in err


def test_factor_checks_keep_finite_numbers():
    assert math.isfinite(whatif.parse_variant("gemm:1e3")[1])


@pytest.mark.parametrize("flag", ["norm_topk", "score_bias", "check"])
def test_weave_moe_flags_must_be_booleans(flag):
    from weave_kernel.module import WeaveMoE

    kw = dict(hidden=64, inter=64, num_experts=4, top_k=2, max_tokens=8, backend="torch", device="cpu")
    WeaveMoE(**kw, **{flag: False})
    with pytest.raises(ValueError, match=f"{flag} must be True or False, got 'no'"):
        WeaveMoE(**kw, **{flag: "no"})
