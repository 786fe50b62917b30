"""Bad-input errors that can be checked without a GPU; policy parsing; buffer plan."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from weave_kernel.buffers import BLOCK_M, plan_buffers  # noqa: E402
from weave_kernel.policies import POLICY_SEQUENTIAL, POLICY_STATIC, parse_policy  # noqa: E402
from weave_kernel.geometry import check_geometry  # noqa: E402
from weave_kernel.validate import check_layer_inputs  # noqa: E402

H, I, E, EL, K, MAXT = 128, 64, 8, 4, 2, 16


def good(n=10):
    return dict(
        x=torch.zeros(n, H, dtype=torch.bfloat16),
        topk_ids=torch.zeros(n, K, dtype=torch.int32),
        topk_weights=torch.zeros(n, K, dtype=torch.float32),
        w13=torch.zeros(EL, 2 * I, H, dtype=torch.bfloat16),
        w2=torch.zeros(EL, H, I, dtype=torch.bfloat16),
    )


def check(**t):
    check_layer_inputs(t["x"], t["topk_ids"], t["topk_weights"], t["w13"], t["w2"], hidden=H, inter=I,
                       num_experts=E, num_local_experts=EL, top_k=K, max_tokens=MAXT, device="cpu")


def test_good_inputs_pass():
    check(**good())
    t = good()
    t["topk_ids"] = t["topk_ids"].long()
    check(**t)


@pytest.mark.parametrize("name,bad,exc,match", [
    ("x", torch.zeros(10, H, dtype=torch.float16), TypeError, "x must have dtype"),
    ("topk_ids", torch.zeros(10, K, dtype=torch.float32), TypeError, "topk_ids must have dtype"),
    ("topk_weights", torch.zeros(10, K, dtype=torch.bfloat16), TypeError, "topk_weights must have dtype"),
    ("w13", torch.zeros(EL, 2 * I, H, dtype=torch.float32), TypeError, "w13 must have dtype"),
    ("w2", torch.zeros(EL, I, H, dtype=torch.bfloat16), ValueError, "w2 must have shape"),
    ("w13", torch.zeros(EL + 1, 2 * I, H, dtype=torch.bfloat16), ValueError, "w13 must have shape"),
    ("topk_ids", torch.zeros(10, K + 1, dtype=torch.int32), ValueError, "topk_ids must have shape"),
    ("topk_weights", torch.zeros(K, 10, dtype=torch.float32).t(), ValueError, "contiguous"),
    ("x", torch.zeros(H, 10, dtype=torch.bfloat16).t(), ValueError, "contiguous"),
    ("x", torch.zeros(10, H, dtype=torch.bfloat16, device="meta"), ValueError, "is on meta"),
    ("topk_ids", "not a tensor", TypeError, "must be a torch.Tensor"),
])
def test_bad_tensor(name, bad, exc, match):
    t = good()
    t[name] = bad
    with pytest.raises(exc, match=match):
        check(**t)


def test_ids_out_of_range():
    for v in (E, -1, 1000):
        t = good()
        t["topk_ids"][3, 1] = v
        with pytest.raises(ValueError, match="expert id"):
            check(**t)


def test_too_many_tokens():
    with pytest.raises(ValueError, match="max_tokens"):
        check(**good(MAXT + 1))


@pytest.mark.parametrize("args,match", [
    ((2880, 2880 + 32, 32, 4, 2, 2), "multiples of 64"),
    ((100, 128, 32, 4, 2, 2), "multiples of 64"),
    ((128, 128, 32, 4, 2, 4), "placement is for 4 GPUs"),
    ((128, 128, 33, 4, 2, 2), "multiple of the world size"),
    ((128, 128, 1024, 4, 2, 2), "<= 512"),
    ((128, 128, 8, 9, 2, 2), "top_k"),
    ((128, 128, 32, 4, 16, 16), "world size 16"),
])
def test_bad_geometry(args, match):
    with pytest.raises(ValueError, match=match):
        check_geometry(*args)


def test_every_preset_geometry_is_accepted():
    from weave_sim.presets import PRESETS

    for m in PRESETS.values():
        check_geometry(m.hidden_size, m.expert_ffn_size, m.num_experts, m.top_k, 2, 2)


def test_policies():
    assert parse_policy("sequential", 132).policy_id == POLICY_SEQUENTIAL
    p = parse_policy("static:24", 132)
    assert (p.policy_id, p.num_comm_ctas) == (POLICY_STATIC, 24)
    for bad in ("static:0", "static:132", "static:x", "static", "dynamic", "sequential:3"):
        with pytest.raises(ValueError):
            parse_policy(bad, 132)


def test_buffer_plan_regions_are_disjoint_and_big_enough():
    pl = plan_buffers(hidden=2880, num_experts=32, top_k=4, world=2, max_tokens=1000)
    offs = [pl.off_count_flag, pl.off_comb_flag, pl.off_gcounts, pl.off_blk_flag, pl.off_recv_meta, pl.off_comb,
            pl.off_recv_x, pl.total_bytes]
    assert offs == sorted(offs) and all(o % 256 == 0 for o in offs)
    assert pl.recv_cap_rows % BLOCK_M == 0 and pl.max_row_blocks * BLOCK_M == pl.recv_cap_rows
    # worst case: all 2*1000*4 pairs on one owner plus a partial block per local expert (sources packed)
    assert pl.recv_cap_rows >= 2 * 1000 * 4 + 16 * (BLOCK_M - 1)
    # one row flag (u64) per (row block, source)
    assert pl.off_recv_meta - pl.off_blk_flag >= 8 * pl.max_row_blocks * 2
    assert pl.off_recv_x - pl.off_comb >= 1000 * 4 * 2880 * 2
    assert pl.total_bytes - pl.off_recv_x >= pl.recv_cap_rows * 2880 * 2


def _mutations():
    """One call's tensors with one thing wrong each (and the unchanged call): dtype, shape, layout, count."""
    yield "good", good()
    for name in ("x", "topk_ids", "topk_weights", "w13", "w2"):
        t = good()
        t[name] = t[name].to(torch.float16 if t[name].dtype != torch.float16 else torch.float32)
        yield f"{name} dtype", t
        t = good()
        t[name] = t[name][..., :-1]  # one column short (and not contiguous)
        yield f"{name} shape", t
        t = good()
        v = t[name]
        t[name] = v.transpose(-1, -2).contiguous().transpose(-1, -2)  # the same shape, column-major
        assert not t[name].is_contiguous()
        yield f"{name} layout", t
        t = good()
        t[name] = v.tolist()
        yield f"{name} not a tensor", t
    t = good(MAXT + 1)
    yield "too many tokens", t
    t = good()
    t["topk_ids"] = t["topk_ids"].long()
    yield "int64 ids", t


@pytest.mark.parametrize("label,t", list(_mutations()), ids=lambda v: v if isinstance(v, str) else "")
def test_the_fast_check_accepts_only_what_the_full_checks_accept(label, t, monkeypatch):
    """check_layer_inputs first asks _inputs_fine (half the host time); whatever it accepts, the detailed checks that
    run when it declines must accept too, so the fast path never lets a bad call through."""
    fine, full = _fast_and_full(t, monkeypatch, fp8=False)
    assert fine == full, label
    assert fine == (label in ("good", "int64 ids")), label


def _fast_and_full(t, monkeypatch, fp8: bool) -> tuple[bool, bool]:
    """(what the fast predicate says, whether the detailed checks alone accept) for one call's tensors."""
    from weave_kernel import validate

    h, i = (H8, I8) if fp8 else (H, I)
    fine = validate._inputs_fine(t["x"], t["topk_ids"], t["topk_weights"], t["w13"], t["w2"], h, i, EL, K, MAXT,
                                 "cpu", fp8)
    monkeypatch.setattr(validate, "_inputs_fine", lambda *a: False)  # the detailed checks alone
    try:
        (check_fp8 if fp8 else check)(**t)
        return fine, True
    except (ValueError, TypeError):
        return fine, False


# ---- FP8 experts: the same fast check over (e4m3, scales) pairs ---------------------------------------------------

H8, I8 = 256, 384  # FP8 blocks are 128 x 128 (every scale tensor at least 2 x 2: a layout change shows)


def good_fp8(n=10):
    t = good(n)
    t["x"] = torch.zeros(n, H8, dtype=torch.bfloat16)
    f8, f32 = torch.float8_e4m3fn, torch.float32
    t["w13"] = (torch.zeros(EL, 2 * I8, H8, dtype=f8), torch.ones(EL, 2 * I8 // 128, H8 // 128, dtype=f32))
    t["w2"] = (torch.zeros(EL, H8, I8, dtype=f8), torch.ones(EL, H8 // 128, I8 // 128, dtype=f32))
    return t


def check_fp8(**t):
    check_layer_inputs(t["x"], t["topk_ids"], t["topk_weights"], t["w13"], t["w2"], hidden=H8, inter=I8,
                       num_experts=E, num_local_experts=EL, top_k=K, max_tokens=MAXT, device="cpu", fp8=True)


def _fp8_mutations():
    """An FP8 call's tensors with one thing wrong each: every member of the weight pairs in dtype, shape and layout,
    the pairs themselves (bf16 tensors instead, swapped, too short), and the token tensors."""
    yield "good", good_fp8()
    for name in ("w13", "w2"):
        for j, part in enumerate(("q", "scale")):
            for kind in ("dtype", "shape", "layout"):
                t = good_fp8()
                pair = list(t[name])
                v = pair[j]
                pair[j] = (v.to(torch.bfloat16) if kind == "dtype" else v[..., :-1] if kind == "shape"
                           else v.transpose(-1, -2).contiguous().transpose(-1, -2))
                t[name] = tuple(pair)
                yield f"{name} {part} {kind}", t
        t = good_fp8()
        t[name] = t[name][0].to(torch.bfloat16)
        yield f"{name} a bf16 tensor", t
        t = good_fp8()
        t[name] = t[name][::-1]
        yield f"{name} pair swapped", t
        t = good_fp8()
        t[name] = t[name][:1]
        yield f"{name} one of the pair", t
    t = good_fp8()
    t["x"] = t["x"][:, :-1]
    yield "x shape", t
    t = good_fp8()
    t["topk_weights"] = t["topk_weights"].half()
    yield "topk_weights dtype", t
    yield "too many tokens", good_fp8(MAXT + 1)
    t = good_fp8()
    t["topk_ids"] = t["topk_ids"].long()
    t["w13"] = list(t["w13"])
    yield "int64 ids, w13 a list", t


@pytest.mark.parametrize("label,t", list(_fp8_mutations()), ids=lambda v: v if isinstance(v, str) else "")
def test_the_fast_check_accepts_only_what_the_full_checks_accept_fp8(label, t, monkeypatch):
    """FP8 layers take the fast path too (their detailed checks took about twice its host time); what it accepts,
    the detailed FP8 checks accept."""
    fine, full = _fast_and_full(t, monkeypatch, fp8=True)
    assert fine == full, label
    assert fine == (label in ("good", "int64 ids, w13 a list")), label
