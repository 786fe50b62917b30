"""recv_capacity: receive buffers below the worst case, and the recoverable ReceiveOverflow (host side, CPU; the
kernel's side runs in gpu_worker.py and virtual_worker.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from weave_kernel import buffers as buf  # noqa: E402
from weave_kernel import megakernel as mk  # noqa: E402
from weave_kernel.virtual import VirtualRanks  # noqa: E402


def test_capacity_sizes_the_receive_rows():
    worst = buf.plan_buffers(2048, 64, 8, 4, 4096)
    assert worst.recv_cap_rows == buf.plan_buffers(2048, 64, 8, 4, 4096, recv_capacity=None).recv_cap_rows
    two = buf.plan_buffers(2048, 64, 8, 4, 4096, recv_capacity=2 * 4096 * 8)  # twice a balanced load
    assert two.recv_cap_rows == -(-(2 * 4096 * 8 + 16 * 127) // 128) * 128
    assert buf.plan_buffers(2048, 64, 8, 4, 4096, recv_capacity=10**9) == worst  # never above the worst case
    a = buf.workspace_bytes(hidden=7168, inter=2048, num_experts=256, top_k=8, world=8, max_tokens=4096)
    b = buf.workspace_bytes(hidden=7168, inter=2048, num_experts=256, top_k=8, world=8, max_tokens=4096,
                           recv_capacity=2 * 4096 * 8)
    assert b["total"] < 0.4 * a["total"]  # DeepSeek-V3 at EP=8: the receive rows are most of the buffers
    for bad in (0, -5, 2.5, True, "100"):
        with pytest.raises(ValueError, match="recv_capacity must be a positive integer"):
            buf.plan_buffers(2048, 64, 8, 4, 4096, recv_capacity=bad)


def _host_layer(code: int, rank: int = 0) -> mk.MoEMegakernel:
    """A MoEMegakernel's host state only (no GPU): an error word as the kernel leaves it."""
    layer = object.__new__(mk.MoEMegakernel)
    layer.err = torch.tensor([code, 5, 1, 2400], dtype=torch.int32)
    layer.rank, layer.broken, layer.recv_capacity = rank, None, 400
    layer._unread, layer._captured = 1, False  # as after one launch
    layer.plan = buf.plan_buffers(1024, 16, 4, 2, 512, recv_capacity=400)
    return layer


def test_an_overflow_checked_by_its_own_call_leaves_the_layer_usable():
    layer = _host_layer(mk.ERR_RECV_OVERFLOW)
    with pytest.raises(mk.ReceiveOverflow, match="rank 1: 2400 rows needed.*at most 1536 rows.*stays usable") as ei:
        layer.raise_if_error(_just_called=True)
    assert (ei.value.owner, ei.value.rows) == (1, 2400)
    assert layer.broken is None and int(layer.err.abs().sum()) == 0
    layer.raise_if_error()  # nothing left to report


def test_an_overflow_found_later_is_an_error_like_any_other():
    layer = _host_layer(mk.ERR_RECV_OVERFLOW)
    with pytest.raises(RuntimeError, match="receive buffer overflow") as ei:
        layer.raise_if_error()  # after check=False calls (or graph replays): other calls started on the error word
    assert not isinstance(ei.value, mk.ReceiveOverflow) and layer.broken
    other = _host_layer(5)  # a timeout is never recoverable
    with pytest.raises(RuntimeError, match="timeout waiting for the rows") as ei:
        other.raise_if_error(_just_called=True)
    assert not isinstance(ei.value, mk.ReceiveOverflow) and other.broken


def _virtual(codes):
    vr = object.__new__(VirtualRanks)
    vr.layers = [_host_layer(c, rank=r) for r, c in enumerate(codes)]
    vr.world = len(codes)
    return vr


def test_virtual_ranks_recover_only_when_every_rank_overflowed():
    vr = _virtual([mk.ERR_RECV_OVERFLOW] * 3)
    with pytest.raises(mk.ReceiveOverflow):
        vr.raise_if_error(_just_called=True)
    assert not any(layer.broken for layer in vr.layers)
    vr = _virtual([mk.ERR_RECV_OVERFLOW, 0, mk.ERR_RECV_OVERFLOW])  # not every rank: the ranks disagree
    with pytest.raises(RuntimeError) as ei:
        vr.raise_if_error(_just_called=True)
    assert not isinstance(ei.value, mk.ReceiveOverflow) and vr.layers[0].broken and vr.layers[2].broken


def test_weavemoe_splits_a_batch_that_overflows():
    """on_overflow="split": a forward whose batch overflows runs again as halves, recursively, and returns the rows in
    order (a stand-in kernel here that overflows above 3 rows); "raise" lets ReceiveOverflow through."""
    from weave_kernel.module import WeaveMoE

    calls = []

    def fake_layer(x, ids, w, w13, w2, **kw):
        calls.append(x.shape[0])
        if x.shape[0] > 3:
            raise mk.ReceiveOverflow("too many", owner=0, rows=x.shape[0])
        return x * 2

    m = WeaveMoE(hidden=64, inter=64, num_experts=4, top_k=2, max_tokens=16, backend="torch")
    m.layer = fake_layer
    x = torch.arange(10 * 64, dtype=torch.float32).view(10, 64)
    ids = torch.zeros(10, 2, dtype=torch.int32)
    y = m._kernel_call(x, ids, ids.float(), None, torch.arange(10.0))
    assert torch.equal(y, x * 2)
    assert calls == [10, 5, 3, 2, 5, 3, 2]  # 10 -> 5 + 5, each 5 -> 3 + 2
    m.on_overflow = "raise"
    with pytest.raises(mk.ReceiveOverflow):
        m._kernel_call(x, ids, ids.float(), None, None)
    with pytest.raises(ValueError, match="on_overflow must be"):
        WeaveMoE(hidden=64, inter=64, num_experts=4, top_k=2, max_tokens=16, backend="torch", on_overflow="retry")


def test_memory_planner(capsys):
    """python -m weave_kernel.memory: the routed experts' share, the shared experts, the routers and one kernel's
    buffers per GPU; bad arguments get a usage line."""
    from weave_kernel.memory import main, moe_memory
    from weave_sim.presets import get_model

    m = get_model("deepseek-v2-lite")  # 26 MoE layers, 64 experts, H 2048, I 1408, 2 shared experts
    r = moe_memory(m, 4, 4096)
    assert r["routed"] == 26 * 16 * 3 * 1408 * 2048 * 2 and r["shared"] == 26 * 3 * 2816 * 2048 * 2
    assert r["buffers"] == buf.workspace_bytes(hidden=2048, inter=1408, num_experts=64, top_k=6, world=4,
                                              max_tokens=4096, shared_inter=2816)["total"]
    assert r["total_kernel_per_layer"] - r["total"] == 25 * r["buffers"]
    assert moe_memory(m, 4, 4096, recv_factor=2)["buffers"] < r["buffers"]
    f8 = moe_memory(m, 4, 4096, fp8=True)  # e4m3 weights plus an fp32 scale per 128 x 128 block, the FP8 buffers
    blocks = 2 * 11 * 16 + 16 * 11  # gate, up [1408, 2048] and down [2048, 1408] in 128 x 128 blocks
    assert f8["routed"] == 26 * 16 * (3 * 1408 * 2048 + 4 * blocks)
    assert f8["shared"] == 26 * (3 * 2816 * 2048 + 4 * (2 * 22 * 16 + 16 * 22))
    # the FP8 kernel's own buffers: e4m3 h and x with their scales, the shared expert's e4m3 h and scales
    assert f8["buffers"] == buf.workspace_bytes(hidden=2048, inter=1408, num_experts=64, top_k=6, world=4,
                                               max_tokens=4096, shared_inter=2816, expert_dtype="fp8")["total"] \
        < r["buffers"]
    assert f8["total_kernel_per_layer"] - f8["total"] == 25 * f8["buffers"]
    assert moe_memory(m, 4, 4096, recv_factor=2, fp8=True)["buffers"] < f8["buffers"]
    with pytest.raises(ValueError, match="multiples of 128"):  # the FP8 kernel's scale blocks
        moe_memory(get_model("custom:E=8:k=2:H=256:I=192:layers=2"), 2, 64, fp8=True)
    assert main(["--models", "deepseek-v2-lite", "--gpus", "8", "--fp8"]) == 0
    out = capsys.readouterr().out
    assert "experts in FP8" in out and "the FP8 kernel's buffers" in out and out.count("\n") == 3
    assert main(["--models", "deepseek-v2-lite", "--gpus", "1,8"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v2-lite" in out and out.count("\n") == 4
    for argv, msg in ((["--gpus", "x"], "comma-separated integers"), (["--models", "nope"], "unknown model"),
                      (["--recv-factor", "0"], "number > 0")):
        with pytest.raises(SystemExit):
            main(argv)
        assert msg in capsys.readouterr().err


def test_memory_planner_refuses_odd_arguments(capsys):
    """--recv-factor inf was an OverflowError traceback; --gpu-gib 0, negative or nan marked every row 'no'; --models
    ',' printed a header without rows; a custom spec's name no longer shifts its row out of the columns."""
    from weave_kernel.memory import main, moe_memory
    from weave_sim.presets import get_model

    for argv, msg in ((["--recv-factor", "inf"], "--recv-factor must be a finite number > 0"),
                      (["--gpu-gib", "0"], "--gpu-gib must be a finite number > 0"),
                      (["--gpu-gib", "-1"], "--gpu-gib must be"), (["--gpu-gib", "nan"], "--gpu-gib must be"),
                      (["--models", ","], "--models: at least one model")):
        with pytest.raises(SystemExit):
            main(argv)
        assert msg in capsys.readouterr().err
    with pytest.raises(ValueError, match="recv_factor must be a finite number"):
        moe_memory(get_model("qwen3-30b-a3b"), 8, 4096, recv_factor=float("inf"))
    spec = "custom:E=64:k=4:H=2048:I=1024:layers=24"
    assert main(["--models", f"{spec},qwen3-30b-a3b", "--gpus", "8"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()[1:]
    assert len(rows) == 2 and all(line[header.index("EP") + 1] == "8" for line in rows)  # EP under its header


def test_weavemoe_checks_recv_capacity_on_either_backend():
    """The torch backend took recv_capacity=0, -1, 2.5 or True (and dispatch='bogus'), which the kernel backend
    refuses: a block tested on CPU then failed on the GPU. Its value is checked on both now."""
    from weave_kernel.module import WeaveMoE

    kw = dict(hidden=64, inter=64, num_experts=4, top_k=2, max_tokens=16, backend="torch")
    for bad in (0, -1, 2.5, True, "5"):
        with pytest.raises(ValueError, match="recv_capacity must be a positive integer"):
            WeaveMoE(**kw, recv_capacity=bad)
    with pytest.raises(ValueError, match="dispatch must be one of"):
        WeaveMoE(**kw, dispatch="bogus")
    for good in (None, 1, 10**12):  # above the worst case: the worst case
        WeaveMoE(**kw, recv_capacity=good)


def _calling_layer(monkeypatch, overflows):
    """_host_layer whose __call__ runs on CPU: each launch sets the error word from `overflows` (True: this launch
    overflows), as the kernel does."""
    layer = _host_layer(0)
    layer._unread = 0
    layer.hidden, layer.inter, layer.num_experts, layer.num_local_experts, layer.top_k = 64, 64, 16, 8, 4
    layer.max_tokens, layer.device, layer.num_ctas, layer.epoch, layer.timeline_per_cta = 512, torch.device("cpu"), 8, 0, 0
    layer._params = lambda *a, **kw: {}
    launches = []

    class _Ext:
        def launch(self, params, stream):
            launches.append(layer.epoch)
            if overflows.pop(0) and int(layer.err[0]) == 0:
                layer.err.copy_(torch.tensor([mk.ERR_RECV_OVERFLOW, 0, 1, 2400], dtype=torch.int32))

    layer.ext = _Ext()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0})())
    x, ids = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.int32)
    args = (x, ids, torch.full((3, 4), 0.25), torch.zeros(8, 128, 64, dtype=torch.bfloat16),
            torch.zeros(8, 64, 64, dtype=torch.bfloat16))
    return layer, args, launches


def test_an_overflow_left_by_an_unchecked_call_is_not_the_next_checked_calls(monkeypatch):
    """A check=False call that overflowed leaves the error word raised; the next check=True call used to report it as
    its own, recoverable ReceiveOverflow (WeaveMoE then split and ran again on a layer whose unchecked call had
    produced garbage, silently). Such a call now reads the word before launching: an unrecoverable error."""
    layer, args, launches = _calling_layer(monkeypatch, [True, False])
    layer(*args, policy="static:2", check=False)
    with pytest.raises(RuntimeError, match="receive buffer overflow") as ei:
        layer(*args, policy="static:2", check=True)
    assert not isinstance(ei.value, mk.ReceiveOverflow) and layer.broken and launches == [1]
    # unchecked calls that did not overflow, then a checked one that does: its own, recoverable
    layer, args, launches = _calling_layer(monkeypatch, [False, False, True, False])
    layer(*args, policy="static:2", check=False)
    layer(*args, policy="static:2", check=False)
    with pytest.raises(mk.ReceiveOverflow):
        layer(*args, policy="static:2", check=True)
    assert not layer.broken and launches == [1, 2, 3]
    layer(*args, policy="static:2", check=True)  # the layer stays usable
    # a layer captured in a CUDA graph: its replays run unseen, so every checked call reads the word first
    layer, args, launches = _calling_layer(monkeypatch, [])
    layer._captured = True
    layer.err.copy_(torch.tensor([mk.ERR_RECV_OVERFLOW, 0, 1, 2400], dtype=torch.int32))  # a replay overflowed
    with pytest.raises(RuntimeError) as ei:
        layer(*args, policy="static:2", check=True)
    assert not isinstance(ei.value, mk.ReceiveOverflow) and layer.broken and launches == []


def test_virtual_ranks_read_what_unchecked_calls_left_before_a_checked_call():
    """VirtualRanks(check=True) after check=False calls: an overflow those left is an error, found before launching."""
    vr = _virtual([mk.ERR_RECV_OVERFLOW] * 2)
    vr.num_ctas, vr.device = 8, torch.device("cpu")
    for layer in vr.layers:
        layer.hidden, layer.inter, layer.num_experts, layer.num_local_experts, layer.top_k = 64, 64, 16, 8, 4
        layer.max_tokens = 512
    x, ids = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.int32)
    per_rank = [[t, t] for t in (x, ids, torch.full((3, 4), 0.25), torch.zeros(8, 128, 64, dtype=torch.bfloat16),
                                 torch.zeros(8, 64, 64, dtype=torch.bfloat16))]
    with pytest.raises(RuntimeError) as ei:
        vr(*per_rank, policy="static:2", check=True)
    assert not isinstance(ei.value, mk.ReceiveOverflow) and all(layer.broken for layer in vr.layers)


def test_the_kernel_checks_its_options_before_building_anything():
    """MoEMegakernel refuses bad scalar options and profiles first (these run before any CUDA call, so on CPU too)."""
    from weave_sim.placement import contiguous

    kw = dict(hidden=256, inter=128, num_experts=8, top_k=2, placement=contiguous(8, 1), max_tokens=64)
    for bad, match in ((dict(timeout_s=0), "timeout_s"), (dict(timeout_s=-1.0), "timeout_s"),
                       (dict(num_ctas=0), "num_ctas"), (dict(timeline_per_cta=-4), "timeline_per_cta"),
                       (dict(cost_profile="no-such-profile"), "no hardware profile")):
        with pytest.raises(Exception, match=match):
            mk.MoEMegakernel(**kw, **bad)
