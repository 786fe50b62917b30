"""CPU checks of the virtual-rank harness (weave_kernel/virtual.py); the GPU runs are test_virtual_ranks_gpu.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from weave_kernel import buffers as buf  # noqa: E402
from weave_kernel import megakernel as mk  # noqa: E402
from weave_kernel.virtual import default_ctas_per_rank  # noqa: E402


def test_ctas_per_rank_share_the_sms():
    assert default_ctas_per_rank(132, 1) == 132
    assert default_ctas_per_rank(132, 2) == 66
    assert default_ctas_per_rank(132, 3) == 44
    assert default_ctas_per_rank(132, 8) == 16
    with pytest.raises(ValueError, match="at least"):
        default_ctas_per_rank(15, 8)
    with pytest.raises(ValueError, match=">= 1"):
        default_ctas_per_rank(132, 0)


def _virtual_layer(rank, world, plan):
    layer = object.__new__(mk.MoEMegakernel)
    layer.virtual, layer.rank, layer.world, layer.plan = True, rank, world, plan
    layer.device = torch.device("cpu")
    layer.symm = torch.zeros(64, dtype=torch.uint8)
    layer.peer_base = torch.zeros(world, dtype=torch.int64)
    return layer


def test_connect_points_every_rank_at_every_buffer():
    plan = buf.plan_buffers(256, 8, 2, 4, 64)
    layers = [_virtual_layer(r, 4, plan) for r in range(4)]
    for layer in layers:
        layer.connect(layers)
    want = [layer.symm.data_ptr() for layer in layers]
    assert all(layer.peer_base.tolist() == want for layer in layers)
    assert len(set(want)) == 4


def test_connect_rejects_a_wrong_world():
    plan = buf.plan_buffers(256, 8, 2, 4, 64)
    layers = [_virtual_layer(r, 4, plan) for r in range(4)]
    with pytest.raises(ValueError, match="every virtual rank"):
        layers[0].connect(layers[:3])
    with pytest.raises(ValueError, match="every virtual rank"):
        layers[0].connect(layers[::-1])
    other = _virtual_layer(3, 4, buf.plan_buffers(512, 8, 2, 4, 64))
    with pytest.raises(ValueError, match="share"):
        layers[0].connect(layers[:3] + [other])
    real = _virtual_layer(0, 4, plan)
    real.virtual = False
    with pytest.raises(RuntimeError, match="virtual ranks"):
        real.connect(layers)


def test_params_ask_for_a_plain_launch_on_virtual_ranks():
    layer = _virtual_layer(0, 2, buf.plan_buffers(256, 8, 2, 2, 64))
    for name in ("expert_owner", "owner_experts", "expert_ctr", "pair_slot", "sorted_pair", "g0_done", "sched",
                 "grid_bar", "err", "timeline", "timeline_count", "h", "cost_table", "choice", "epoch_ctr", "hs", "ys",
                 "g0s_done"):
        setattr(layer, name, torch.zeros(8))
    layer.top_k, layer.hidden, layer.inter, layer.num_experts, layer.num_local_experts = 2, 256, 128, 8, 4
    layer.shared_inter, layer.max_shared_blocks = 0, 1
    layer.max_tokens, layer.num_ctas, layer.timeline_per_cta, layer.epoch, layer.timeout_ns = 64, 66, 0, 1, 10**9
    x = torch.zeros(10, 256, dtype=torch.bfloat16)
    pol = mk.parse_policy("static:8", layer.num_ctas)
    for coop, dispatch, warps in ((True, "threads", 0), (False, "bulk", mk.BULK_ISSUERS), (False, "bulk:3", 3)):
        layer.cooperative, layer.dispatch = coop, dispatch
        d = layer._params(x, x, x, x, x, x, pol, False)
        assert d["cooperative"] == int(coop) and d["dispatch_bulk"] == warps
        assert d["peer_base"] == layer.peer_base.data_ptr()
    # a shared expert: its width and order reach the kernel only when the call passes its weights
    layer.shared_inter = 192
    sw = (torch.zeros(384, 256, dtype=torch.bfloat16), torch.zeros(256, 192, dtype=torch.bfloat16))
    d = layer._params(x, x, x, x, x, x, pol, False, sw, "first")
    assert (d["inter_shared"], d["shared_first"], d["w13s"], d["w2s"]) == (192, 1, sw[0].data_ptr(), sw[1].data_ptr())
    d = layer._params(x, x, x, x, x, x, pol, False)
    assert (d["inter_shared"], d["shared_first"], d["w13s"]) == (0, 0, 0)


def test_dispatch_mode_is_checked_before_anything_is_built():
    from weave_sim.placement import contiguous

    for bad in ("dma", "bulk:0", "bulk:13", "bulk:x", "threads:2"):
        with pytest.raises(ValueError, match="dispatch must be one of"):
            mk.MoEMegakernel(hidden=256, inter=128, num_experts=8, top_k=2, placement=contiguous(8, 2), max_tokens=64,
                             virtual=(0, 2), device="cpu", dispatch=bad)
    assert mk.DISPATCH_MODES == ("threads", "bulk") and mk.dispatch_issuers("bulk:12") == 12


def test_fp8_ranks_check_fp8_shared_experts():
    """VirtualRanks validates an FP8 layer's shared expert as FP8 (q, s) pairs, as MoEMegakernel does (it checked them
    as bf16 tensors and refused every FP8 shared expert: found by fuzz_worker --fp8)."""
    from types import SimpleNamespace

    from weave_kernel.fp8 import quantize_experts, quantize_weight
    from weave_kernel.virtual import VirtualRanks

    H, I, Is, E, k, G = 256, 128, 256, 4, 2, 2
    vr = object.__new__(VirtualRanks)
    vr.world, vr.device, vr.num_ctas = G, torch.device("cpu"), 66
    vr.layers = [SimpleNamespace(broken=None, hidden=H, inter=I, num_experts=E, num_local_experts=E // G, top_k=k,
                                 max_tokens=16, fp8=True, shared_inter=Is, _unread=0, _captured=False)
                 for _ in range(G)]
    w13, w2 = quantize_experts(torch.randn(E // G, 2 * I, H), torch.randn(E // G, H, I))
    shared = (quantize_weight(torch.randn(2 * Is, H)), quantize_weight(torch.randn(H, Is)))
    xs = [torch.randn(8, H).to(torch.bfloat16) for _ in range(G)]
    ids = [torch.tensor([[0, 1]] * 8, dtype=torch.int32) for _ in range(G)]
    tws = [torch.full((8, k), 0.5) for _ in range(G)]
    # every rank's inputs pass (FP8 pairs for experts and shared expert); the call then stops at the bad order
    with pytest.raises(ValueError, match="shared_order must be one of"):
        vr(xs, ids, tws, [w13] * G, [w2] * G, shared=[shared] * G, shared_order="middle")
    bf16_shared = (torch.randn(2 * Is, H).to(torch.bfloat16), torch.randn(H, Is).to(torch.bfloat16))
    with pytest.raises(ValueError, match="w13s of an FP8 layer must be a pair"):
        vr(xs, ids, tws, [w13] * G, [w2] * G, shared=[bf16_shared] * G)


def test_rank_experts_takes_tensors_and_fp8_pairs_in_local_order(kernel_script):
    """virtual_worker.rank_experts: a rank's experts (placement.local_experts order) of a tensor or of both tensors
    of an FP8 (q, s) pair, as the workers hand them to each virtual rank."""
    from weave_sim.placement import round_robin

    vw = kernel_script("virtual_worker")
    pl = round_robin(8, 2)
    w = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    s = torch.arange(8, dtype=torch.float32).view(8, 1)
    for r in range(2):
        want = list(pl.local_experts(r))
        assert torch.equal(vw.rank_experts(w, pl, r), w[want])
        q, sc = vw.rank_experts((w, s), pl, r)
        assert torch.equal(q, w[want]) and torch.equal(sc, s[want]) and q.is_contiguous()
