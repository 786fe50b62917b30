"""WeaveMoE on the torch backend (CPU): routing, weight loading and the shared expert against a per-token fp32 loop
written the way HF MoE blocks compute, and the errors for bad input. The kernel backend runs in gpu_worker.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from weave_kernel.module import WeaveMoE, stack_expert_weights  # noqa: E402
from weave_sim.placement import round_robin  # noqa: E402

H, I, E, K, IS = 64, 128, 8, 2, 192


def hf_block(x, router, gate, up, down, *, k, scoring, norm, scale=1.0, bias=None, shared=None, shared_gate=None,
             groups=None):
    """One token at a time, fp32: the MoE block as the checkpoints' modelling code writes it. groups: (n_group,
    topk_group), DeepSeek's group-limited routing (V3: a group's score is the sum of its two best biased sigmoid
    scores; V2: its best softmax score)."""
    x = x.float()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        logits = router.float() @ x[t]
        s = torch.softmax(logits, 0) if scoring == "softmax" else torch.sigmoid(logits)
        choice = s + (bias if bias is not None else 0)
        if groups is not None:
            n_group, topk_group = groups
            per = choice.view(n_group, -1)
            gscore = per.topk(2).values.sum(-1) if scoring == "sigmoid" else per.max(-1).values
            allowed = set(torch.topk(gscore, topk_group).indices.tolist())
            choice = torch.stack([c if e // per.shape[1] in allowed else torch.tensor(float("-inf"))
                                  for e, c in enumerate(choice)])
        ids = torch.topk(choice, k).indices
        w = s[ids]
        if norm:
            w = w / w.sum()
        for j in range(k):
            e = int(ids[j])
            h = torch.nn.functional.silu(gate[e].float() @ x[t]) * (up[e].float() @ x[t])
            out[t] += scale * w[j] * (down[e].float() @ h)
        if shared is not None:
            g, u, d = (m.float() for m in shared)
            ys = d @ (torch.nn.functional.silu(g @ x[t]) * (u @ x[t]))
            out[t] += ys * (torch.sigmoid(shared_gate.float() @ x[t]) if shared_gate is not None else 1.0)
    return out


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, d=1.0: (torch.randn(*s, generator=g) / d**0.5).to(torch.bfloat16)  # noqa: E731
    return dict(router=r(E, H, d=H), gate=r(E, I, H, d=H), up=r(E, I, H, d=H), down=r(E, H, I, d=I),
                sg=r(IS, H, d=H), su=r(IS, H, d=H), sd=r(H, IS, d=IS), sgate=r(1, H, d=H), bias=torch.randn(E, generator=g),
                x=torch.randn(3, 11, H, generator=g).to(torch.bfloat16))


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("scoring,norm,scale,use_bias,gated", [
    ("softmax", True, 1.0, False, True),    # Qwen-MoE: softmax, renormalised top-k, gated shared expert
    ("softmax", False, 1.0, False, False),  # DeepSeek-V2: softmax without renormalising, plain shared expert
    ("sigmoid", True, 2.5, True, False),    # DeepSeek-V3: sigmoid scores, correction bias to pick, scaled
])
def test_block_matches_the_hf_loop(scoring, norm, scale, use_bias, gated):
    w = weights()
    moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch", device="cpu",
                   scoring=scoring, norm_topk=norm, routed_scale=scale, score_bias=use_bias, shared_inter=IS,
                   shared_gate=gated)
    moe.load_router(w["router"], w["bias"] if use_bias else None)
    moe.load_experts(list(w["gate"]), w["up"], w["down"])
    moe.load_shared(w["sg"], w["su"], w["sd"], w["sgate"] if gated else None)
    y = moe(w["x"])
    assert y.shape == w["x"].shape and y.dtype == torch.bfloat16
    ref = hf_block(w["x"].reshape(-1, H), w["router"], w["gate"], w["up"], w["down"], k=K, scoring=scoring, norm=norm,
                   scale=scale, bias=w["bias"] if use_bias else None, shared=(w["sg"], w["su"], w["sd"]),
                   shared_gate=w["sgate"] if gated else None)
    assert rel(y.reshape(-1, H), ref) < 1e-2


@pytest.mark.parametrize("scoring,use_bias", [("sigmoid", True), ("softmax", False)])  # DeepSeek-V3, V2
def test_group_limited_routing_matches_the_hf_loop(scoring, use_bias):
    w = weights(4)
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch", device="cpu", scoring=scoring,
              norm_topk=True, score_bias=use_bias)
    moe = WeaveMoE(**kw, n_group=4, topk_group=1)
    moe.load_router(w["router"], w["bias"] if use_bias else None)
    moe.load_experts(w["gate"], w["up"], w["down"])
    ids, _ = moe.route(w["x"].reshape(-1, H))
    assert (ids // (E // 4)).unique(dim=1).shape[1] == 1  # topk_group 1: both picks from one group of 2
    ref = hf_block(w["x"].reshape(-1, H), w["router"], w["gate"], w["up"], w["down"], k=K, scoring=scoring, norm=True,
                   bias=w["bias"] if use_bias else None, groups=(4, 1))
    assert rel(moe(w["x"]).reshape(-1, H), ref) < 1e-2
    flat = WeaveMoE(**kw)  # without groups the routing differs somewhere among 33 tokens
    flat.load_router(w["router"], w["bias"] if use_bias else None)
    assert not torch.equal(flat.route(w["x"].reshape(-1, H))[0], ids)
    for bad in (dict(n_group=3), dict(n_group=4, topk_group=5), dict(n_group=8, topk_group=1)):
        with pytest.raises(ValueError, match="n_group|exceeds"):
            WeaveMoE(**kw, **bad)


def test_local_experts_follow_the_placement():
    w = weights(1)
    pl = round_robin(E, 1)
    moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=8, backend="torch", device="cpu",
                   placement=pl)
    moe.load_experts(w["gate"], w["up"], w["down"])
    for le, e in enumerate(pl.local_experts(0)):
        assert torch.equal(moe.w13[le, :I], w["gate"][e]) and torch.equal(moe.w13[le, I:], w["up"][e])
        assert torch.equal(moe.w2[le], w["down"][e])


def test_custom_router_and_stacking_modules():
    w = weights(2)
    experts = []
    for e in range(E):
        m = torch.nn.Module()
        for n, t in (("gate_proj", w["gate"][e]), ("up_proj", w["up"][e]), ("down_proj", w["down"][e])):
            lin = torch.nn.Linear(t.shape[1], t.shape[0], bias=False)
            lin.weight.data = t.clone()
            setattr(m, n, lin)
        experts.append(m)
    g, u, d = stack_expert_weights(experts)
    assert torch.equal(g, w["gate"]) and torch.equal(d, w["down"])
    fixed = lambda x: (torch.zeros(x.shape[0], K, dtype=torch.int64) + torch.arange(K),  # noqa: E731
                       torch.full((x.shape[0], K), 0.5))
    moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch", device="cpu",
                   router=fixed)
    moe.load_experts(g, u, d)
    x = w["x"][0]
    ids, tw = moe.route(x)
    assert ids.dtype == torch.int32 and ids.tolist() == [[0, 1]] * x.shape[0] and tw.dtype == torch.float32
    # experts 0 and 1 at weight 0.5 each: the loop with a router whose softmax is flat over 0 and 1 only
    ref = sum(0.5 * (w["down"][e].float() @ (torch.nn.functional.silu(w["gate"][e].float() @ x.float().t()) *
                                              (w["up"][e].float() @ x.float().t()))).t() for e in (0, 1))
    assert rel(moe(x), ref) < 1e-2


def test_bad_input_is_refused():
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=8, backend="torch", device="cpu")
    with pytest.raises(ValueError, match="backend"):
        WeaveMoE(**{**kw, "backend": "triton"})
    with pytest.raises(ValueError, match="scoring"):
        WeaveMoE(**kw, scoring="relu")
    with pytest.raises(ValueError, match="top_k"):
        WeaveMoE(**{**kw, "top_k": E + 1})
    with pytest.raises(ValueError, match="shared_gate needs"):
        WeaveMoE(**kw, shared_gate=True)
    moe = WeaveMoE(**kw)
    w = weights()
    with pytest.raises(ValueError, match="gate_proj must be"):
        moe.load_experts(w["up"][:, :, :32], w["up"], w["down"])
    with pytest.raises(ValueError, match="without a shared expert"):
        moe.load_shared(w["sg"], w["su"], w["sd"])
    with pytest.raises(ValueError, match="score_bias given"):
        moe.load_router(w["router"], w["bias"])
    with pytest.raises(TypeError, match="bf16"):
        moe(w["x"].float())
    with pytest.raises(ValueError, match="hidden size"):
        moe(w["x"][..., :32])
    gated = WeaveMoE(**kw, shared_inter=IS, shared_gate=True)
    with pytest.raises(ValueError, match="gate_weight goes with"):
        gated.load_shared(w["sg"], w["su"], w["sd"])


def test_e2e_stack_runs_on_cpu_with_the_torch_backend():
    """weave_kernel.e2e's pieces (its timing needs CUDA): the stack's layers and their MoE blocks on CPU."""
    from weave_kernel.e2e import DecoderLayer, build_moes
    from weave_sim.presets import get_model

    model = get_model("custom:E=8:k=2:H=256:I=128:shared=1")
    moes = build_moes(model, 2, 16, "torch", "weave", True, torch.device("cpu"), seed=3)
    again = build_moes(model, 1, 16, "torch", "weave", True, torch.device("cpu"), seed=3)[0]
    assert torch.equal(moes[0].w13, again.w13) and torch.equal(moes[0].w2s, again.w2s)  # a draw per (layer, key)
    assert not torch.equal(moes[0].w13, moes[1].w13)
    torch.manual_seed(0)
    layer = DecoderLayer(256, moes[0], torch.device("cpu"))
    x = torch.randn(16, 256).to(torch.bfloat16)
    y, y_attn = layer(x), layer(x, with_moe=False)
    assert y.shape == x.shape and torch.isfinite(y.float()).all() and not torch.equal(y, y_attn)


def test_e2e_stack_in_fp8_holds_the_same_draws_quantized():
    """e2e --expert-dtype fp8: the blocks hold fp8.quantize_weight of the bf16 draws (experts and shared expert), and
    the stack runs on CPU with the torch backend's FP8 arithmetic."""
    from weave_kernel.e2e import DecoderLayer, build_moes
    from weave_kernel.fp8 import quantize_weight
    from weave_sim.presets import get_model

    model = get_model("custom:E=8:k=2:H=256:I=128:shared=1")
    b16 = build_moes(model, 1, 16, "torch", "weave", True, torch.device("cpu"), seed=3)[0]
    f8 = build_moes(model, 1, 16, "torch", "weave", True, torch.device("cpu"), seed=3, expert_dtype="fp8")[0]
    q, s = quantize_weight(b16.w13)
    assert torch.equal(f8.w13_q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(f8.w13_s, s)
    q, s = quantize_weight(b16.w2)
    assert torch.equal(f8.w2_q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(f8.w2_s, s)
    torch.manual_seed(0)
    layer = DecoderLayer(256, f8, torch.device("cpu"))
    x = torch.randn(16, 256).to(torch.bfloat16)
    y = layer(x)
    assert y.shape == x.shape and torch.isfinite(y.float()).all()


def _rank_forward(rank: int, world: int, port: int, queue, cut: int = 13) -> None:
    """One rank of test_two_ranks_match_one_process (gloo on CPU): WeaveMoE's torch backend across the group."""
    import os

    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        w = weights(5)
        moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch", device="cpu",
                       placement=round_robin(E, world), shared_inter=IS)
        moe.load_router(w["router"])
        moe.load_experts(w["gate"], w["up"], w["down"])
        moe.load_shared(w["sg"], w["su"], w["sd"])
        x = w["x"].reshape(-1, H)[[slice(0, cut), slice(cut, 33)][rank]]  # ranks with different token counts
        queue.put((rank, moe.local, moe(x).float().numpy()))
        dist.barrier()  # the parent has read the results before any rank tears the group down
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("cut", [13, 0])  # 0: rank 0 has no tokens and still takes part in the exchanges
def test_two_ranks_match_one_process(cut):
    """The multi-rank path of WeaveMoE (each rank keeps its placement's experts; tokens cross ranks by all-to-all)
    gives every rank the rows one process with all experts computes."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_forward, args=(r, 2, port, queue, cut)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (local, y)) for r, local, y in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[0][0] == [0, 2, 4, 6] and got[1][0] == [1, 3, 5, 7]  # round-robin: each rank its own experts
    w = weights(5)
    one = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch", device="cpu",
                   shared_inter=IS)
    one.load_router(w["router"])
    one.load_experts(w["gate"], w["up"], w["down"])
    one.load_shared(w["sg"], w["su"], w["sd"])
    ref = one(w["x"].reshape(-1, H)).float()
    assert got[0][1].shape == (cut, H) and rel(torch.from_numpy(got[1][1]), ref[cut:]) < 1e-2
    if cut:
        assert rel(torch.from_numpy(got[0][1]), ref[:cut]) < 1e-2


@pytest.mark.parametrize("kw", [dict(), dict(n_group=4, topk_group=2),
                                dict(scoring="sigmoid", score_bias=True, n_group=4, topk_group=2),
                                dict(shared_inter=IS, shared_gate=True)])
def test_zero_tokens(kw):
    """A rank (or a batch) without tokens: empty routing and an empty output of the input's shape, every router
    style (group-limited routing used to fail reshaping its 0 rows into groups, the reference its 0 pairs)."""
    moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=8, backend="torch", device="cpu", **kw)
    ids, tw = moe.route(torch.zeros(0, H, dtype=torch.bfloat16))
    assert ids.shape == tw.shape == (0, K)
    for shape in ((0, H), (2, 0, H)):
        y = moe(torch.zeros(shape, dtype=torch.bfloat16))
        assert y.shape == shape and y.dtype == torch.bfloat16


def test_route_takes_rows_only():
    """route() reads x as [N, H]: a 3-D batch used to come back with the right ids and wrong weights (the gather ran
    along the sequence axis); now it, a 1-D row and a wrong width are refused, and forward() still takes [..., H]."""
    w = weights(6)
    moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch", device="cpu")
    moe.load_router(w["router"])
    moe.load_experts(w["gate"], w["up"], w["down"])
    x = w["x"][:2, :10]  # [2, 10, H]: 10 >= E, so the old gather along dim 1 did not fail
    for bad in (x, x[0, 0], x[0][:, :32], x[0].float().numpy()):
        with pytest.raises(ValueError, match="route\\(\\) takes x"):
            moe.route(bad)
    ids, tw = moe.route(x.reshape(-1, H))
    assert ids.shape == tw.shape == (20, K)
    assert torch.equal(moe(x).reshape(-1, H), moe(x.reshape(-1, H)))
    with pytest.raises(ValueError, match="hidden size"):
        moe(torch.tensor(1.0, dtype=torch.bfloat16))  # 0-D: an IndexError before


@pytest.mark.parametrize("out,err,match", [
    (lambda n: (torch.zeros(n, K + 1, dtype=torch.int64), torch.ones(n, K + 1)), ValueError, "topk_ids of shape"),
    (lambda n: (torch.zeros(1, K, dtype=torch.int64), torch.ones(1, K)), ValueError, "topk_ids of shape"),
    (lambda n: (torch.zeros(n, K, dtype=torch.int64), torch.ones(n)), ValueError, "topk_weights of shape"),
    (lambda n: (torch.zeros(n, K) + 0.7, torch.ones(n, K)), TypeError, "topk_ids of dtype"),  # was truncated to 0
    (lambda n: (torch.zeros(n, K, dtype=torch.int64), torch.ones(n, K, dtype=torch.int64)), TypeError, "topk_weights of dtype"),
    (lambda n: torch.zeros(n, K, dtype=torch.int64), TypeError, "must return"),
    (lambda n: ([[0, 1]] * n, torch.ones(n, K)), TypeError, "not a tensor"),
])
def test_custom_router_output_is_checked(out, err, match):
    """What router= returns must be what the kernel reads: [N, k] integer ids and [N, k] float weights; anything else
    is refused by name instead of being cast or failing deep in the reference."""
    w = weights(2)
    moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch", device="cpu",
                   router=lambda x: out(x.shape[0]))
    moe.load_experts(w["gate"], w["up"], w["down"])
    with pytest.raises(err, match=match):
        moe(w["x"][0])
    ok = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch", device="cpu",
                  router=lambda x: (torch.arange(K).expand(x.shape[0], K), torch.full((K, x.shape[0]), 0.5).t()))
    ids, tw = ok.route(w["x"][0].reshape(-1, H))  # non-contiguous outputs come back contiguous, as the kernel needs
    assert ids.is_contiguous() and tw.is_contiguous() and ids.dtype == torch.int32 and tw.dtype == torch.float32


def test_torch_backend_checks_calls_as_the_kernel_does():
    """The torch backend used to run what the kernel refuses: more rows than max_tokens, expert ids outside [0, E)
    from router= (negative ids silently indexed from the end), x on another device. It now raises as the kernel's
    call does, so model code tested on CPU runs unchanged on the kernel backend."""
    w = weights(7)
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=K, backend="torch", device="cpu")
    moe = WeaveMoE(**kw, max_tokens=16)
    moe.load_experts(w["gate"], w["up"], w["down"])
    moe(w["x"][0])  # 11 rows: fine
    with pytest.raises(ValueError, match="33 tokens exceed the 16"):
        moe(w["x"])
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        WeaveMoE(**kw, max_tokens=0)
    for bad_id in (-1, E):
        routed = WeaveMoE(**kw, max_tokens=16, router=lambda x, b=bad_id: (torch.full((x.shape[0], K), b),
                                                                            torch.ones(x.shape[0], K)))
        routed.load_experts(w["gate"], w["up"], w["down"])
        with pytest.raises(ValueError, match=f"expert id {bad_id}, outside \\[0, {E}\\)"):
            routed(w["x"][0])
    with pytest.raises(ValueError, match="x is on meta, the layer runs on cpu"):
        moe(torch.empty(3, H, dtype=torch.bfloat16, device="meta"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU says")
def test_kernel_backend_without_a_gpu_says_so():
    """backend="kernel" (the default) on a machine without CUDA used to try to build the extension and fail on
    CUDA_HOME or a missing .so; it now says what it needs and what runs instead."""
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=8)
    for extra in (dict(), dict(device="cpu"), dict(device="cuda")):
        with pytest.raises(RuntimeError, match="needs a CUDA device.*backend='torch'"):
            WeaveMoE(**kw, **extra)


@pytest.mark.parametrize("bad,err,match", [
    (dict(shared_inter=64, shared_order="bogus"), ValueError, "shared_order must be one of"),  # kernel-only check before
    (dict(policy="waeve"), ValueError, "unknown policy"),
    (dict(policy="static:x"), ValueError, "integer C"),
    (dict(timout_s=3), TypeError, "unexpected keyword arguments \\['timout_s'\\]"),  # a typo, ignored before
    (dict(router_dtype=torch.int32), TypeError, "router_dtype"),   # integer logits, silently, before
    (dict(router_dtype="bfloat16"), TypeError, "router_dtype"),    # 'Invalid device string' before
    (dict(routed_scale=float("nan")), ValueError, "routed_scale must be finite"),
    (dict(top_k=2.0), TypeError, "top_k must be an integer"),
    (dict(hidden=0), ValueError, "hidden must be >= 1"),
    (dict(inter=-3), ValueError, "inter must be >= 1"),
    (dict(shared_inter=-5), ValueError, "shared_inter must be >= 0"),
    (dict(max_tokens=-1), ValueError, "max_tokens must be >= 1"),
    # the kernel's geometry limits on the torch backend too (it ran them, and the kernel refused the same block)
    (dict(hidden=96), ValueError, "multiples of 64"),
    (dict(shared_inter=100), ValueError, "shared expert's width"),
    (dict(num_experts=1024, top_k=2), ValueError, "num_experts 1024 must be <= 512"),
    # the kernel's scalar options on either backend (timeout 0 made every wait fail at once; NaN raised in int())
    (dict(timeout_s=0), ValueError, "timeout_s must be a number of seconds"),
    (dict(timeout_s=float("nan")), ValueError, "timeout_s must be a number of seconds"),
    (dict(timeout_s="2"), ValueError, "timeout_s must be a number of seconds"),
    (dict(num_ctas=1), ValueError, "num_ctas must be None"),
    (dict(num_ctas=2.5), ValueError, "num_ctas must be None"),
    (dict(timeline_per_cta=-1), ValueError, "timeline_per_cta must be an integer >= 0"),
    (dict(cost_profile="nope"), Exception, "no hardware profile 'nope'"),
    # router= with rule options it would leave unused (silently, before)
    (dict(router=lambda x: None, scoring="sigmoid"), ValueError, "scoring would be unused"),
    (dict(router=lambda x: None, norm_topk=False, routed_scale=2.0), ValueError, "norm_topk, routed_scale would be"),
])
def test_inconsistent_options_are_refused(bad, err, match):
    """Options the torch backend used to accept and ignore (or fail on with another library's message)."""
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=8, backend="torch", device="cpu")
    with pytest.raises(err, match=match):
        WeaveMoE(**{**kw, **bad})


def test_legal_odd_options_still_run():
    """The kernel's own options pass through the torch backend (a model built for one backend runs on the other);
    top_k = num_experts, numpy integers and a bf16 router are fine."""
    import numpy as np

    w = weights(8)
    moe = WeaveMoE(hidden=np.int64(H), inter=I, num_experts=E, top_k=E, max_tokens=64, backend="torch", device="cpu",
                   timeout_s=3.0, dispatch="bulk", policy="static:20", router_dtype=torch.bfloat16, shared_order="first")
    moe.load_router(w["router"])
    moe.load_experts(w["gate"], w["up"], w["down"])
    ids, tw = moe.route(w["x"][0])
    assert sorted(ids[0].tolist()) == list(range(E)) and torch.allclose(tw.sum(-1), torch.ones(11))
    ref = hf_block(w["x"][0], w["router"], w["gate"], w["up"], w["down"], k=E, scoring="softmax", norm=True)
    assert rel(moe(w["x"][0]), ref) < 1e-2


def test_failed_loads_change_nothing():
    """A load that raises leaves the block's weights as they were (load_shared used to copy gate/up/down and then
    refuse a missing gate_weight; load_router copied the weight before refusing the bias); a list of experts of
    the wrong shapes is refused by name, not by torch.stack."""
    w = weights(9)
    moe = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=8, backend="torch", device="cpu",
                   shared_inter=IS, shared_gate=True)
    before = {k: v.clone() for k, v in moe.state_dict().items()}
    with pytest.raises(ValueError, match="gate_weight goes with"):
        moe.load_shared(w["sg"], w["su"], w["sd"])
    with pytest.raises(ValueError, match="shared down_proj must be"):
        moe.load_shared(w["sg"], w["su"], w["sd"][:, :64], w["sgate"])
    with pytest.raises(ValueError, match="score_bias given"):
        moe.load_router(w["router"], w["bias"])
    with pytest.raises(ValueError, match=r"gate_proj must be .* got a list of 8: \[\(128, 64\), \(128, 65\)\]"):
        moe.load_experts(list(w["gate"][:7]) + [torch.zeros(I, H + 1)], w["up"], w["down"])
    with pytest.raises(ValueError, match=r"a list of 3"):
        moe.load_experts(list(w["gate"][:3]), w["up"], w["down"])
    assert all(torch.equal(before[k], v) for k, v in moe.state_dict().items())
    biased = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=8, backend="torch", device="cpu",
                      scoring="sigmoid", score_bias=True)
    with pytest.raises(ValueError, match=r"score_bias must be \[8\], got \(9,\)"):  # no '(or a list of ...)'
        biased.load_router(w["router"], torch.zeros(E + 1))
    assert not biased.router_weight.any()


def test_e2e_header_says_when_a_model_has_no_shared_experts():
    """e2e --shared on a model without shared experts runs without them; its header said 'fused' all the same."""
    from weave_kernel.e2e import shared_note
    from weave_sim.presets import get_model

    assert shared_note(get_model("deepseek-v2-lite"), True) == "fused"
    assert shared_note(get_model("qwen3-30b-a3b"), True) == "none in qwen3-30b-a3b"
    assert shared_note(get_model("deepseek-v2-lite"), False) == "left out"


# ---- one MoEMegakernel for several blocks (kernel=) -------------------------------------------------------------
class _FakeKernel:
    """Stands in for a built MoEMegakernel where check_shared_kernel looks (no GPU here; gpu_worker runs real ones)."""

    def __init__(self, placement, group=None, device="cpu", **geometry):
        self.placement, self.group, self.device = placement, group, torch.device(device)
        self.__dict__.update(dict(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, world=1, shared_inter=IS,
                                  num_ctas=132), **geometry)


@pytest.fixture
def fake_kernel(monkeypatch):
    import weave_kernel.megakernel as mk

    monkeypatch.setattr(mk, "MoEMegakernel", _FakeKernel)
    return _FakeKernel


def _check(kernel, **over):
    from weave_kernel.module import check_shared_kernel
    from weave_sim.placement import contiguous

    kw = dict(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, shared_inter=IS, placement=contiguous(E, 1),
              world=1, group=None, device="cpu")
    kw.update(over)
    return check_shared_kernel(kernel, **kw)


def test_a_shared_kernel_must_match_the_block(fake_kernel):
    from weave_sim.placement import contiguous

    k = fake_kernel(contiguous(E, 1))
    assert _check(k) is k
    assert _check(k, shared_inter=0) is k  # a block without a shared expert runs on a kernel with one
    for over, match in ((dict(inter=2 * I), r"inter 128 \(this block: 256\)"), (dict(max_tokens=65), "max_tokens 64"),
                        (dict(top_k=3), "top_k 2"), (dict(hidden=2 * H), "hidden 64"),
                        (dict(shared_inter=64), "shared_inter 192"), (dict(group=object()), "another process group")):
        with pytest.raises(ValueError, match=match):
            _check(k, **over)
    with pytest.raises(ValueError, match="lives on cpu"):
        _check(k, device="meta")
    with pytest.raises(TypeError, match="MoEMegakernel or a WeaveMoE"):
        _check(object())
    cpu_block = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch")
    with pytest.raises(ValueError, match="without a kernel"):
        _check(cpu_block)


def test_a_shared_kernel_must_place_the_experts_alike(fake_kernel):
    from weave_sim.placement import contiguous

    k = fake_kernel(contiguous(E, 2), world=2)
    assert _check(k, world=2, placement=contiguous(E, 2)) is k
    with pytest.raises(ValueError, match="places the experts differently"):
        _check(k, world=2, placement=round_robin(E, 2))


def test_kernel_is_for_the_kernel_backend_and_takes_no_kernel_options(fake_kernel):
    from weave_sim.placement import contiguous

    k = fake_kernel(contiguous(E, 1))
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64)
    with pytest.raises(ValueError, match="backend='kernel'"):
        WeaveMoE(**kw, backend="torch", kernel=k)


def test_workspace_bytes_counts_what_the_layer_allocates():
    from weave_kernel.buffers import BLOCK_M, plan_buffers, workspace_bytes

    kw = dict(hidden=2048, inter=768, num_experts=128, top_k=8, world=2, max_tokens=4096)
    w = workspace_bytes(**kw)
    plan = plan_buffers(2048, 128, 8, 2, 4096)
    assert w["symmetric"] == plan.total_bytes and w["h"] == 2 * plan.recv_cap_rows * 768
    assert w["total"] == sum(v for k, v in w.items() if k != "total")
    # the receive rows: every pair of every rank on one owner, plus a partial block per local expert
    assert plan.recv_cap_rows == -(-(2 * 4096 * 8 + 64 * (BLOCK_M - 1)) // BLOCK_M) * BLOCK_M
    assert w["shared"] < 2**14  # placeholders (one row) without a shared expert
    ws = workspace_bytes(**kw, shared_inter=1536)
    assert ws["shared"] >= 2 * 4096 * (1536 + 2048)  # h and y rows of the shared expert per token
    big = workspace_bytes(**dict(kw, world=8))
    assert big["symmetric"] > 2.5 * w["symmetric"]  # the receive rows grow with world x max_tokens x top_k


def test_check_fits_names_the_sizes_and_the_short_rank(monkeypatch):
    """The memory check before a layer is built (its GPU figures faked here): enough free memory passes, too little
    raises MemoryError with the parts and the hint; torch's unused cache counts as free; CPU tensors are not checked."""
    from weave_kernel.buffers import check_fits

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (3 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 2 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 2**30)
    need = {"symmetric": 3 * 2**30, "h": 2**29, "total": 3 * 2**30 + 2**29}
    check_fits(need, "cuda:0")  # 3.5 GiB needed, 3 + (2 - 1) GiB free
    need = {"symmetric": 4 * 2**30, "h": 2**29, "total": 4 * 2**30 + 2**29}
    with pytest.raises(MemoryError, match=r"need 4.50 GiB per rank \(symmetric 4.00 GiB, h 0.50 GiB\) and rank 0's "
                                          r"GPU has 4.00 GiB free: lower it"):
        check_fits(need, "cuda:0", hint="lower it")
    check_fits(need, "cpu")


def test_group_none_is_the_default_group(fake_kernel):
    """A kernel built with group=None serves a block given the default group explicitly, and the other way round."""
    import torch.distributed as dist
    from weave_sim.placement import contiguous

    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        k = fake_kernel(contiguous(E, 1))
        assert _check(k, group=dist.group.WORLD) is k
        k2 = fake_kernel(contiguous(E, 1), group=dist.group.WORLD)
        assert _check(k2, group=None) is k2
        other = dist.new_group([0])
        with pytest.raises(ValueError, match="another process group"):
            _check(k, group=other)
    finally:
        dist.destroy_process_group()


class _PlacedKernel:
    """A kernel call that records its calls; only its placement matters here."""

    def __init__(self, placement):
        self.placement, self.calls = placement, 0

    def __call__(self, x, ids, w, w13, w2, **kw):
        self.calls += 1
        return x.clone()


def test_a_forward_after_the_kernels_placement_changed_is_refused():
    """set_placement on a (shared) kernel used to leave every block on it computing with the experts it had loaded for
    the old placement, silently wrong; such a forward now raises. The same placement as another object still runs.
    (World 2 by hand: the placements of one rank all agree.)"""
    from weave_sim.placement import contiguous

    m = WeaveMoE(hidden=H, inter=I, num_experts=E, top_k=K, max_tokens=64, backend="torch")
    m.backend, m.world, m.placement = "kernel", 2, contiguous(E, 2)
    m.layer = _PlacedKernel(contiguous(E, 2))  # equal, not the same object
    x = torch.randn(5, H).to(torch.bfloat16)
    assert torch.equal(m(x), x) and m.placement is m.layer.placement
    m.layer.placement = round_robin(E, 2)  # what MoEMegakernel.set_placement does to the kernel
    with pytest.raises(RuntimeError, match="placement has changed since.*build the block again"):
        m(x)
    assert m.layer.calls == 1


def test_e2e_records_the_buffers_of_every_kernel():
    """e2e --separate-kernels recorded one kernel's workspace_bytes for a kernel per layer too (the same figure as one
    shared kernel); kernel_buffer_bytes now sums every kernel, as hf_e2e.py does."""
    from types import SimpleNamespace

    from weave_kernel.e2e import kernel_buffers

    class _K:
        def workspace_bytes(self):
            return {"total": 1000}

    one = _K()
    assert kernel_buffers([SimpleNamespace(layer=one)] * 4) == \
        {"kernels": 1, "workspace_bytes": 1000, "kernel_buffer_bytes": 1000}
    assert kernel_buffers([SimpleNamespace(layer=_K()) for _ in range(4)]) == \
        {"kernels": 4, "workspace_bytes": 1000, "kernel_buffer_bytes": 4000}
