"""The FP8 layer's host side without a GPU or the extension: the buffer plan and workspace accounting of
expert_dtype="fp8", fp8_scale_stride against csrc/params.h, the call checks of (e4m3, scale) weight pairs, the
constructor's refusals (all before the extension loads), and the FP8 operands in _params / the Launcher's
arguments."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from weave_kernel import buffers as buf  # noqa: E402
from weave_kernel import megakernel as mk  # noqa: E402
from weave_kernel.fp8 import BLOCK, FP8, quantize_act, quantize_experts  # noqa: E402
from weave_kernel.policies import parse_policy  # noqa: E402
from weave_kernel.validate import check_layer_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "weave_kernel" / "csrc"
CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

# geometries (hidden, num_experts, top_k, world, max_tokens, recv_capacity): small and DeepSeek-V3-sized
PLANS = [(256, 8, 2, 1, 64, None), (256, 8, 2, 2, 64, None), (1024, 16, 4, 4, 300, 500),
         (7168, 256, 8, 8, 4096, None), (2048, 64, 6, 4, 4096, 2 * 4096 * 6), (384, 4, 1, 1, 1, None)]
_OFFSETS = ("off_count_flag", "off_comb_flag", "off_gcounts", "off_blk_flag", "off_recv_meta", "off_comb",
            "off_recv_x")


# ---- plan_buffers / workspace_bytes ------------------------------------------------------------------------------
@pytest.mark.parametrize("geom", PLANS)
def test_plan_buffers_places_the_received_rows_scales_after_the_rows(geom):
    h, e, k, g, t, cap = geom
    bf = buf.plan_buffers(h, e, k, g, t, cap)
    f8 = buf.plan_buffers(h, e, k, g, t, cap, fp8=True)
    assert bf.off_recv_xs == 0
    assert f8.off_recv_xs > 0 and f8.off_recv_xs % 256 == 0
    # after the receive rows (bf16-sized: the sequential policy writes its bf16 outputs over the e4m3 rows)
    assert f8.off_recv_xs >= f8.off_recv_x + 2 * f8.recv_cap_rows * h
    assert f8.off_recv_xs == buf._align(f8.off_recv_x + 2 * f8.recv_cap_rows * h)
    region = 4 * f8.recv_cap_rows * buf.fp8_scale_stride(h)
    assert f8.total_bytes == buf._align(f8.off_recv_xs + region)
    assert f8.total_bytes - f8.off_recv_xs >= region
    # every other offset and size as the bf16 plan's
    for name in _OFFSETS + ("recv_cap_rows", "max_row_blocks"):
        assert getattr(f8, name) == getattr(bf, name), name
    assert bf.total_bytes == f8.off_recv_xs  # the bf16 plan ends where the scales begin
    assert buf.plan_buffers(h, e, k, g, t, cap, fp8=False) == bf


@pytest.mark.parametrize("geom", [(256, 256, 8, 2, 1, 64, None), (7168, 2048, 256, 8, 8, 4096, None),
                                  (2048, 1408, 64, 6, 4, 4096, 2 * 4096 * 6), (1024, 384, 16, 4, 2, 300, 500)])
@pytest.mark.parametrize("timeline", [0, 16])
def test_workspace_bytes_of_fp8_experts(geom, timeline):
    h, i, e, k, g, t, cap = geom
    kw = dict(hidden=h, inter=i, num_experts=e, top_k=k, world=g, max_tokens=t, recv_capacity=cap, num_ctas=100,
              timeline_per_cta=timeline)
    bf = buf.workspace_bytes(**kw)
    f8 = buf.workspace_bytes(**kw, expert_dtype="fp8")
    assert buf.workspace_bytes(**kw, expert_dtype="bf16") == bf
    rows = buf.plan_buffers(h, e, k, g, t, cap).recv_cap_rows
    assert bf["h"] == 2 * rows * i
    assert f8["h"] == rows * i + 4 * rows * buf.fp8_scale_stride(i)  # e4m3 h and its padded scale rows
    assert f8["other"] - bf["other"] == t * h + 4 * t * buf.fp8_scale_stride(h)  # x in e4m3 and its scales
    plan8 = buf.plan_buffers(h, e, k, g, t, cap, fp8=True)
    assert f8["symmetric"] == plan8.total_bytes
    assert f8["symmetric"] - bf["symmetric"] == plan8.total_bytes - plan8.off_recv_xs  # the scales' region
    assert f8["symmetric"] - bf["symmetric"] == buf._align(4 * rows * buf.fp8_scale_stride(h))
    assert f8["shared"] == bf["shared"]
    assert f8["total"] == f8["symmetric"] + f8["h"] + f8["shared"] + f8["other"]


@pytest.mark.parametrize("bad", ["fp16", "FP8", "e4m3", "", None, 8, torch.float8_e4m3fn])
def test_workspace_bytes_refuses_other_expert_dtypes(bad):
    with pytest.raises(ValueError, match="expert_dtype must be one of"):
        buf.workspace_bytes(hidden=256, inter=256, num_experts=8, top_k=2, world=1, max_tokens=64, expert_dtype=bad)
    with pytest.raises(ValueError, match="expert_dtype must be one of"):
        buf.check_expert_dtype(bad)


# ---- fp8_scale_stride: Python and C++ -----------------------------------------------------------------------------
KS = sorted({*range(0, 128 * 80, 128), *(128 * m for m in (95, 96, 97, 127, 128, 129, 160, 1024)),
             *(128 * 32 * m + d for m in (1, 2, 3) for d in (-128, 0, 128)), 64, 127, 129, 1000, 7168, 18432, 2048})


def test_fp8_scale_stride_pads_to_128_byte_lines():
    for k in KS:
        s = buf.fp8_scale_stride(k)
        assert s % 32 == 0 and k // BLOCK <= s < k // BLOCK + 32, k
    assert [buf.fp8_scale_stride(k) for k in (128, 4096, 4224, 7168)] == [32, 32, 64, 64]


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_fp8_scale_stride_matches_params_h(tmp_path):
    src = tmp_path / "stride.cpp"
    ks = ", ".join(str(k) for k in KS)
    src.write_text('#include <cstdio>\n#include "params.h"\nint main() {\n'
                   f'  const int ks[] = {{{ks}}};\n'
                   '  for (int k : ks) std::printf("%d %d\\n", k, weave::fp8_scale_stride(k));\n'
                   '  static_assert(weave::fp8_scale_stride(7168) == 64, "constexpr");\n}\n')
    exe = tmp_path / "stride"
    subprocess.run([CXX, "-std=c++17", f"-I{CSRC}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    got = {int(a): int(b) for a, b in (line.split() for line in out.splitlines())}
    assert list(got) == KS
    assert got == {k: buf.fp8_scale_stride(k) for k in KS}


# ---- check_layer_inputs(fp8=True) ---------------------------------------------------------------------------------
EL, H, I, K, E, T = 2, 256, 256, 2, 4, 64  # two local experts of four (world 2)


def _pairs(seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(EL, 2 * I, H, generator=g) * 0.05
    w2 = torch.randn(EL, H, I, generator=g) * 0.05
    return quantize_experts(w13, w2)


def _tokens(n=10):
    x = torch.randn(n, H).to(torch.bfloat16)
    ids = torch.stack([torch.arange(n) % E, (torch.arange(n) + 1) % E], 1).to(torch.int32)
    return x, ids, torch.full((n, K), 0.5)


def _check(x, ids, tw, w13, w2, *, device="cpu", fp8=True, check_ids=True):
    check_layer_inputs(x, ids, tw, w13, w2, hidden=H, inter=I, num_experts=E, num_local_experts=EL, top_k=K,
                       max_tokens=T, device=device, check_ids=check_ids, fp8=fp8)


def test_check_layer_inputs_accepts_fp8_pairs():
    (q13, s13), (q2, s2) = _pairs()
    assert q13.dtype == FP8 and tuple(s13.shape) == (EL, 2 * I // BLOCK, H // BLOCK)
    x, ids, tw = _tokens()
    _check(x, ids, tw, (q13, s13), (q2, s2))
    _check(x, ids, tw, [q13, s13], [q2, s2])  # lists as well as tuples
    _check(x, ids.long(), tw, (q13, s13), (q2, s2), device=None)
    _check(x[:0], ids[:0], tw[:0], (q13, s13), (q2, s2))  # no tokens
    # a bf16 layer's check does not take pairs
    with pytest.raises(TypeError, match="w13 must be a torch.Tensor"):
        _check(x, ids, tw, (q13, s13), (q2, s2), fp8=False)


def test_check_layer_inputs_fp8_names_the_bad_weight():
    (q13, s13), (q2, s2) = _pairs()
    x, ids, tw = _tokens()
    bf13 = torch.zeros(EL, 2 * I, H, dtype=torch.bfloat16)
    bf2 = torch.zeros(EL, H, I, dtype=torch.bfloat16)
    cases = [
        ((bf13, (q2, s2)), r"w13 must be a pair \(q float8_e4m3fn, s float32\), got Tensor"),
        (((q13, s13), bf2), r"w2 must be a pair"),
        (((q13, s13, s13), (q2, s2)), r"w13 must be a pair"),
        (((bf13, s13), (q2, s2)), r"w13 q must be torch.float8_e4m3fn, got torch.bfloat16"),
        (((s13, q13), (q2, s2)), r"w13 q must be torch.float8_e4m3fn, got torch.float32"),  # swapped pair
        (((q13, s13), (s2, q2)), r"w2 q must be torch.float8_e4m3fn, got torch.float32"),
        (((q13, s13.to(torch.bfloat16)), (q2, s2)), r"w13 scale must be torch.float32, got torch.bfloat16"),
        (((q13, s13[:, :, :1]), (q2, s2)), r"w13 scale must have shape \[2, 4, 2\], got \[2, 4, 1\]"),
        (((q13, s13), (q2, s2.transpose(1, 2).contiguous()[:, :1])), r"w2 scale must have shape \[2, 2, 2\]"),
        (((q13, s13), (q2, torch.zeros(EL, H, I // BLOCK))), r"w2 scale must have shape"),
        (((q13, s13), (q2, s2.view(EL * 4))), r"w2 scale must have shape"),
        (((q13, s13), (q2.transpose(1, 2), s2)), r"w2 q must have shape \[2, 256, 256\]|w2 q must be contiguous"),
        (((q13[:1], s13[:1]), (q2, s2)), r"w13 q must have shape \[2, 512, 256\], got \[1, 512, 256\]"),
        (((q13, s13), (q2, s2.transpose(1, 2))), r"w2 scale must be contiguous"),
        (((q13, s13), (q2, s2.numpy())), r"w2 scale must be a torch.Tensor"),
    ]
    for (w13, w2), msg in cases:
        with pytest.raises(ValueError, match=msg):
            _check(x, ids, tw, w13, w2)


def test_check_layer_inputs_fp8_weights_on_another_device():
    (q13, s13), (q2, s2) = _pairs()
    x, ids, tw = _tokens()
    meta = lambda t: torch.empty_like(t, device="meta")  # noqa: E731
    # one tensor of the four on another device than w13 q
    with pytest.raises(ValueError, match=r"w2 scale is on meta, but w13 q is on cpu"):
        _check(x, ids, tw, (q13, s13), (q2, meta(s2)))
    with pytest.raises(ValueError, match=r"w13 scale is on meta, but w13 q is on cpu"):
        _check(x, ids, tw, (q13, meta(s13)), (q2, s2))
    with pytest.raises(ValueError, match=r"w2 q is on meta, but w13 q is on cpu"):
        _check(x, ids, tw, (q13, s13), (meta(q2), s2))
    # all four together, but not on the layer's device
    with pytest.raises(ValueError, match=r"w13 is on meta, the layer runs on cpu"):
        _check(x, ids, tw, (meta(q13), meta(s13)), (meta(q2), meta(s2)))
    # the layer on meta: the weights are on cpu, the tokens too (the weights are checked first)
    with pytest.raises(ValueError, match=r"w13 is on cpu, the layer runs on meta"):
        _check(x, ids, tw, (q13, s13), (q2, s2), device="meta")
    mx, mids, mtw = (meta(t) for t in (x, ids, tw))
    _check(mx, mids, mtw, (meta(q13), meta(s13)), (meta(q2), meta(s2)), device="meta", check_ids=False)
    with pytest.raises(ValueError, match=r"x is on cpu, the layer runs on meta"):
        _check(x, mids, mtw, (meta(q13), meta(s13)), (meta(q2), meta(s2)), device="meta", check_ids=False)


def test_check_layer_inputs_fp8_still_checks_the_tokens():
    w13, w2 = _pairs()
    x, ids, tw = _tokens()
    with pytest.raises(TypeError, match=r"x must have dtype torch.bfloat16, got torch.float32"):
        _check(x.float(), ids, tw, w13, w2)
    with pytest.raises(TypeError, match=r"x must have dtype"):  # x already quantized: the kernel quantizes it
        _check(x.float().to(FP8), ids, tw, w13, w2)
    with pytest.raises(ValueError, match=r"x must have shape \[10, 256\]"):
        _check(torch.zeros(10, 128, dtype=torch.bfloat16), ids, tw, w13, w2)
    with pytest.raises(ValueError, match=r"x must be a 2-D tensor"):
        _check(x.view(-1), ids, tw, w13, w2)
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        _check(torch.zeros(H, 10, dtype=torch.bfloat16).t(), ids, tw, w13, w2)
    with pytest.raises(ValueError, match=r"65 tokens exceed the 64"):
        xs, idss, tws = _tokens(T + 1)
        _check(xs, idss, tws, w13, w2)
    with pytest.raises(TypeError, match=r"topk_ids must have dtype"):
        _check(x, ids.float(), tw, w13, w2)
    with pytest.raises(ValueError, match=r"topk_ids must have shape \[10, 2\]"):
        _check(x, ids[:, :1].contiguous(), tw, w13, w2)
    with pytest.raises(TypeError, match=r"topk_weights must have dtype torch.float32"):
        _check(x, ids, tw.to(torch.bfloat16), w13, w2)
    with pytest.raises(ValueError, match=r"topk_weights must have shape"):
        _check(x, ids, tw[:5], w13, w2)
    bad = ids.clone()
    bad[3, 1] = E
    with pytest.raises(ValueError, match=rf"topk_ids holds expert id {E}, outside \[0, {E}\)"):
        _check(x, bad, tw, w13, w2)
    bad[3, 1] = -1
    with pytest.raises(ValueError, match=r"topk_ids holds expert id -1"):
        _check(x, bad, tw, w13, w2)
    _check(x, bad, tw, w13, w2, check_ids=False)  # not scanned without check_ids (no host sync)


# ---- MoEMegakernel: FP8 refusals before the extension loads ------------------------------------------------------
class _Loaded(AssertionError):
    pass


@pytest.fixture
def no_extension(monkeypatch):
    """load_extension raises: a refusal that a test sees came before the extension was loaded."""
    import weave_kernel.build as build

    def load_extension(*a, **kw):
        raise _Loaded("load_extension was called")

    monkeypatch.setattr(build, "load_extension", load_extension)


def _layer(**kw):
    from weave_sim.placement import contiguous

    args = dict(hidden=256, inter=256, num_experts=8, top_k=2, placement=contiguous(8, 1), max_tokens=64,
                expert_dtype="fp8")
    args.update(kw)
    return mk.MoEMegakernel(**args)


def test_fp8_layer_refusals_come_before_the_extension(no_extension):
    # the control: a geometry the FP8 kernel runs gets as far as loading the extension
    with pytest.raises(_Loaded):
        _layer()
    with pytest.raises(_Loaded):
        _layer(expert_dtype="bf16", hidden=192, shared_inter=128, dispatch="bulk")  # all fine in bf16
    for bad in ("fp16", "FP8", "float8_e4m3fn", None, torch.float8_e4m3fn):
        with pytest.raises(ValueError, match="expert_dtype must be one of"):
            _layer(expert_dtype=bad)
    with pytest.raises(ValueError, match=r"multiples of 128 .* got hidden 192, inter 256"):
        _layer(hidden=192)
    with pytest.raises(ValueError, match=r"multiples of 128 .* got hidden 256, inter 320"):
        _layer(inter=320)
    with pytest.raises(ValueError, match=r"multiples of 128 .* shared_inter 192"):
        _layer(shared_inter=192)
    with pytest.raises(_Loaded):  # an FP8 shared expert of a width in 128s is fine
        _layer(shared_inter=256)
    for d in ("bulk", "bulk:4"):  # e4m3 rows by bulk copies, their scales by the threads
        with pytest.raises(_Loaded):
            _layer(dispatch=d)
    # the geometry's own checks still come first (hidden 100 is no multiple of 64 for either dtype)
    with pytest.raises(ValueError, match=r"positive multiples of 64"):
        _layer(hidden=100)


def test_fp8_layer_refuses_an_extension_without_fp8_experts(no_extension):
    old = type("OldExt", (), {"max_ctas": staticmethod(lambda index: 132)})()
    with pytest.raises(ValueError, match="needs an extension built from sources with FP8 experts"):
        _layer(ext=old)


# ---- _params, _operand_ptrs and the Launcher's arguments of an FP8 layer -----------------------------------------
def _fake_layer(fp8: bool, world=2, rank=0, hidden=256, inter=256, max_tokens=64):
    """A MoEMegakernel with CPU tensors (no extension, no GPU), as tests/kernel/test_weave_policy.py's, FP8 or not."""
    layer = object.__new__(mk.MoEMegakernel)
    i32 = dict(dtype=torch.int32)
    layer.plan = buf.plan_buffers(hidden, 8, 2, world, max_tokens, fp8=fp8)
    for name in ("expert_owner", "owner_experts", "peer_base", "expert_ctr", "pair_slot", "sorted_pair", "g0_done",
                 "sched", "grid_bar", "err", "timeline", "timeline_count", "g0s_done"):
        setattr(layer, name, torch.zeros(8, **i32))
    layer.hs, layer.ys = torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    layer.shared_inter, layer.max_shared_blocks = 0, 1
    layer.epoch_ctr = torch.zeros(1, dtype=torch.int64)
    rows = layer.plan.recv_cap_rows
    layer.fp8 = fp8
    if fp8:
        layer.h = torch.zeros(rows * inter, dtype=torch.uint8)
        layer.h_scale = torch.zeros(rows * buf.fp8_scale_stride(inter))
        layer.x_q = torch.zeros(max_tokens * hidden, dtype=torch.uint8)
        layer.x_s = torch.zeros(max_tokens * buf.fp8_scale_stride(hidden))
    else:
        layer.h = torch.zeros(8, dtype=torch.bfloat16)
    layer.cost_table = torch.as_tensor(mk.build_cost_table())
    layer.choice = torch.full((buf.CHOICE_LEN,), -1.0, dtype=torch.float64)
    layer.rank, layer.world, layer.top_k, layer.hidden, layer.inter = rank, world, 2, hidden, inter
    layer.num_experts, layer.num_local_experts, layer.max_tokens = 8, 8 // world, max_tokens
    layer.num_ctas, layer.timeline_per_cta, layer.epoch, layer.timeout_ns = 132, 0, 3, 10**9
    layer.cooperative, layer.dispatch = True, "threads"
    layer.broken, layer.device, layer._unread, layer._captured = None, torch.device("cpu"), 0, False
    return layer


def _fp8_call_tensors(layer, n=10):
    el = layer.num_local_experts
    w13, w2 = quantize_experts(torch.randn(el, 2 * layer.inter, layer.hidden) * 0.05,
                               torch.randn(el, layer.hidden, layer.inter) * 0.05)
    x = torch.randn(n, layer.hidden).to(torch.bfloat16)
    ids = torch.stack([torch.arange(n) % 8, (torch.arange(n) + 3) % 8], 1).to(torch.int32)
    return x, ids, torch.full((n, 2), 0.5), w13, w2, torch.zeros(n, layer.hidden, dtype=torch.bfloat16)


def test_params_of_an_fp8_layer():
    layer = _fake_layer(fp8=True)
    x, ids, tw, (q13, s13), (q2, s2), y = _fp8_call_tensors(layer)
    pol = parse_policy("weave", layer.num_ctas)
    d = layer._params(x, ids, tw, (q13, s13), (q2, s2), y, pol, False)
    assert d["fp8"] == 1
    assert d["x"] == x.data_ptr()  # bf16 x: the kernel quantizes it into x_q / x_scale
    assert d["x_q"] == layer.x_q.data_ptr() != 0
    assert d["x_scale"] == layer.x_s.data_ptr() != 0
    assert d["w13"] == q13.data_ptr() and d["w13_scale"] == s13.data_ptr()
    assert d["w2"] == q2.data_ptr() and d["w2_scale"] == s2.data_ptr()
    assert d["h"] == layer.h.data_ptr() and d["h_scale"] == layer.h_scale.data_ptr() != 0
    assert d["off_recv_xs"] == layer.plan.off_recv_xs > 0
    assert d["off_recv_x"] == layer.plan.off_recv_x
    assert d["shared_scale"] == d["w13s"] == d["w2s"] == d["inter_shared"] == 0
    assert d["dispatch_bulk"] == 0 and d["y"] == y.data_ptr()
    assert layer._operand_ptrs(x, (q13, s13), (q2, s2)) == (
        x.data_ptr(), q13.data_ptr(), q2.data_ptr(), layer.x_s.data_ptr(), s13.data_ptr(), s2.data_ptr())
    assert layer._operand_ptrs(x, (q13, s13), (q2, s2)) == tuple(d[k] for k in ("x", "w13", "w2", "x_scale",
                                                                                   "w13_scale", "w2_scale"))
    # every key binding.cpp's read_params reads (the host's epoch aside)
    binding = (CSRC / "binding.cpp").read_text()
    start = binding.index("weave::Params read_params(const py::dict& d")
    body = binding[start:binding.index("\n}\n", start)]
    keys = set(re.findall(r'(?:get<[\w:]+>|ptr<[\w:\s]+>)\(d, "(\w+)"\)', body))
    assert keys == set(d) - {"epoch"}, keys ^ (set(d) - {"epoch"})
    # FP8 rows by bulk copies: the issuing warps reach the kernel as for bf16 (binding.cpp no longer refuses them)
    layer.dispatch = "bulk:4"
    assert layer._params(x, ids, tw, (q13, s13), (q2, s2), y, pol, False)["dispatch_bulk"] == 4
    assert "FP8 experts dispatch by threads" not in binding


def test_params_of_a_bf16_layer_carry_no_fp8_operands():
    layer = _fake_layer(fp8=False)
    x = torch.zeros(10, 256, dtype=torch.bfloat16)
    w13, w2 = torch.zeros(4, 512, 256, dtype=torch.bfloat16), torch.zeros(4, 256, 256, dtype=torch.bfloat16)
    d = layer._params(x, torch.zeros(10, 2, dtype=torch.int32), torch.zeros(10, 2), w13, w2, x,
                      parse_policy("static:8", 132), False)
    assert d["fp8"] == d["x_q"] == d["x_scale"] == d["w13_scale"] == d["w2_scale"] == d["h_scale"] == 0
    assert d["off_recv_xs"] == 0 and (d["x"], d["w13"], d["w2"]) == (x.data_ptr(), w13.data_ptr(), w2.data_ptr())
    assert layer._operand_ptrs(x, w13, w2) == (x.data_ptr(), w13.data_ptr(), w2.data_ptr(), 0, 0, 0)


def test_launcher_of_an_fp8_layer_gets_the_scales_in_signature_order(monkeypatch):
    binding = (CSRC / "binding.cpp").read_text()
    sig = re.search(r"void launch\(uint64_t x,(.*?)\) \{", binding, re.S).group(0)
    names = re.findall(r"(?:uint64_t|int32_t) (\w+)", sig)
    assert names[-6:] == ["x_scale", "w13_scale", "w2_scale", "w13s_scale", "w2s_scale", "stream"]
    built, calls = [], []

    class _Launcher:
        def __init__(self, params):
            built.append(params)

        def launch(self, *args):
            calls.append(args)

    layer = _fake_layer(fp8=True)
    layer.ext = type("Ext", (), {"Launcher": _Launcher, "fp8_experts": 2})()
    layer.symm = torch.zeros(8, dtype=torch.uint8)
    layer._launcher, layer._launcher_key = None, None
    monkeypatch.setattr(mk, "_current_raw_stream", lambda device: 4321)
    x, ids, tw, w13, w2, y = _fp8_call_tensors(layer)
    w13b, w2b = quantize_experts(torch.randn(4, 512, 256), torch.randn(4, 256, 256))  # other weights, same layer
    for spec, tl, (a, b) in (("weave", False, (w13, w2)), ("static:8", False, (w13b, w2b)),
                             ("sequential", False, (w13, w2b))):
        pol = parse_policy(spec, layer.num_ctas)
        layer._launch(x, ids, tw, a, b, y, pol, tl)
        want = layer._params(x, ids, tw, a, b, y, pol, tl)
        got = dict(zip(names, calls[-1]))
        assert len(calls[-1]) == len(names)
        assert got.pop("stream") == 4321
        assert got == {k: want[k] for k in got}, spec
        assert (got["w13"], got["w13_scale"], got["w2"], got["w2_scale"]) == (
            a[0].data_ptr(), a[1].data_ptr(), b[0].data_ptr(), b[1].data_ptr())
        assert got["x"] == x.data_ptr() and got["x_scale"] == layer.x_s.data_ptr()
    assert len(built) == 1 and built[0]["fp8"] == 1 and built[0]["x_q"] == layer.x_q.data_ptr()
    assert built[0]["off_recv_xs"] == layer.plan.off_recv_xs and built[0]["h_scale"] == layer.h_scale.data_ptr()


def test_fp8_call_refusals_leave_the_epoch(monkeypatch):
    """An FP8 layer's call refuses bf16 weights and an x that is not 16-byte aligned before the epoch advances."""
    layer = _fake_layer(fp8=True)
    launched = []
    monkeypatch.setattr(layer, "_launch", lambda *a, **kw: launched.append(a), raising=False)
    x, ids, tw, w13, w2, _ = _fp8_call_tensors(layer)
    before = layer.epoch
    bf13 = torch.zeros(4, 512, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="w13 must be a pair"):
        layer(x, ids, tw, bf13, w2, policy="static:8", check=False)
    with pytest.raises(ValueError, match="w13 q must be torch.float8_e4m3fn"):
        layer(x, ids, tw, (w13[1], w13[0]), w2, policy="static:8", check=False)
    buf = torch.zeros(x.numel() + 8, dtype=torch.bfloat16)
    xm = buf[1:1 + x.numel()].view_as(x)  # 2 bytes off an aligned address
    xm.copy_(x)
    assert xm.is_contiguous() and xm.data_ptr() % 16 == 2
    with pytest.raises(ValueError, match="16-byte aligned"):
        layer(xm, ids, tw, w13, w2, policy="static:8", check=False)
    assert layer.epoch == before and not launched
    layer(x, ids, tw, w13, w2, policy="static:8", check=False)  # the launch itself is faked
    assert layer.epoch == before + 1 and len(launched) == 1


def test_quantized_x_views_the_kernels_buffers():
    layer = _fake_layer(fp8=True, hidden=384, max_tokens=16)
    x = torch.randn(5, 384).to(torch.bfloat16)
    q, s = quantize_act(x)
    st = buf.fp8_scale_stride(384)
    layer.x_q[: 5 * 384].copy_(q.view(torch.uint8).reshape(-1))
    layer.x_s.view(16, st)[:5, :3].copy_(s)
    layer.x_s.view(16, st)[:5, 3:].fill_(float("nan"))  # the padding is not part of the scales
    gq, gs = layer.quantized_x(5)
    assert gq.dtype == FP8 and tuple(gq.shape) == (5, 384) and tuple(gs.shape) == (5, 3)
    assert torch.equal(gq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(gs, s)
    with pytest.raises(ValueError, match="expert_dtype='fp8'"):
        _fake_layer(fp8=False).quantized_x(1)


def test_an_fp8_shared_expert_in_params_and_its_checks():
    """FP8 layers take the shared expert as two (e4m3, scales) pairs: their addresses and hs's scales go to the kernel
    (w13s / w13s_scale, w2s / w2s_scale, hs_scale), and validate.check_shared_weights(fp8=True) names a bad one."""
    from weave_kernel.fp8 import quantize_weight
    from weave_kernel.validate import check_shared_weights

    layer = _fake_layer(fp8=True)
    layer.shared_inter = 256
    layer.hs = torch.zeros(64 * 256, dtype=torch.uint8)
    layer.hs_scale = torch.zeros(64 * buf.fp8_scale_stride(256))
    x, ids, tw, w13, w2, y = _fp8_call_tensors(layer)
    sw = (quantize_weight(torch.randn(512, 256)), quantize_weight(torch.randn(256, 256)))
    d = layer._params(x, ids, tw, w13, w2, y, parse_policy("static:8", layer.num_ctas), False, shared=sw)
    assert (d["w13s"], d["w13s_scale"], d["w2s"], d["w2s_scale"]) == (
        sw[0][0].data_ptr(), sw[0][1].data_ptr(), sw[1][0].data_ptr(), sw[1][1].data_ptr())
    assert d["hs_scale"] == layer.hs_scale.data_ptr() != 0 and d["inter_shared"] == 256
    assert layer._shared_ptrs(None) == (0, 0, 0, 0)
    check_shared_weights(*sw, hidden=256, inter_shared=256, fp8=True)
    with pytest.raises(ValueError, match="w13s of an FP8 layer must be a pair"):
        check_shared_weights(torch.zeros(512, 256, dtype=torch.bfloat16), sw[1], hidden=256, inter_shared=256, fp8=True)
    with pytest.raises(ValueError, match=r"w2s scale must have shape \[2, 2\]"):
        check_shared_weights(sw[0], (sw[1][0], torch.zeros(2, 3)), hidden=256, inter_shared=256, fp8=True)
    with pytest.raises(TypeError, match="w13s q must have dtype"):
        check_shared_weights((sw[0][1], sw[0][1]), sw[1], hidden=256, inter_shared=256, fp8=True)
    # workspace_bytes counts the FP8 shared scratch: hs in e4m3 with its scales
    kw = dict(hidden=256, inter=256, num_experts=8, top_k=2, world=2, max_tokens=64, shared_inter=256)
    f8, bf = buf.workspace_bytes(**kw, expert_dtype="fp8"), buf.workspace_bytes(**kw)
    assert bf["shared"] - f8["shared"] == 64 * 256 - 4 * 64 * buf.fp8_scale_stride(256)


@pytest.mark.parametrize("fp8", [False, True])
def test_poison_scratch_leaves_nan_everywhere_a_call_writes(fp8):
    """poison_scratch (the GPU tests' tool against reads of rows nothing wrote this call): combine rows, receive rows
    and their scales, h (and its scales), x_q / x_s and the shared expert's scratch all read as NaN in their dtypes."""
    layer = _fake_layer(fp8=fp8)
    layer.symm = torch.zeros(layer.plan.total_bytes, dtype=torch.uint8)
    if fp8:
        layer.hs = torch.zeros(64 * 256, dtype=torch.uint8)
        layer.hs_scale = torch.zeros(64 * buf.fp8_scale_stride(256))
    layer.poison_scratch()
    pl = layer.plan
    comb = layer.symm[pl.off_comb:pl.off_recv_x]
    assert torch.isnan(comb[: comb.numel() // 2 * 2].view(torch.bfloat16).float()).all()
    recv = layer.symm[pl.off_recv_x:pl.total_bytes]
    if fp8:
        assert torch.isnan(recv.view(torch.float8_e4m3fn).float()).all()
        xs = layer.symm[pl.off_recv_xs:pl.total_bytes]
        assert torch.isnan(xs[: xs.numel() // 4 * 4].view(torch.float32)).all()
        for t in (layer.h, layer.hs, layer.x_q):
            assert torch.isnan(t.view(torch.float8_e4m3fn).float()).all()
        for t in (layer.h_scale, layer.hs_scale, layer.x_s):
            assert torch.isnan(t).all()
    else:
        assert torch.isnan(recv[: recv.numel() // 2 * 2].view(torch.bfloat16).float()).all()
        assert torch.isnan(layer.h.float()).all()
    assert torch.isnan(layer.hs.float() if not fp8 else layer.ys.float()).all() and torch.isnan(layer.ys.float()).all()
