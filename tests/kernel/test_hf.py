"""weave_kernel.hf against real transformers MoE blocks (tiny random configs, CPU, WeaveMoE's torch backend): each
block's output, a whole model's logits after replace_moe_blocks, and refused blocks. Skipped where transformers is
not installed (CI installs only what the tests extra lists)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from weave_kernel.hf import UnsupportedBlock, describe_block, from_hf_block, replace_moe_blocks  # noqa: E402
from weave_kernel.module import WeaveMoE  # noqa: E402

H = 64


def _randomise(mod: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights of unit-scale activations (the blocks create theirs uninitialised), then bf16."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            fan_in = p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
        for name, b in mod.named_buffers():
            if "correction_bias" in name:
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return mod.to(torch.bfloat16)


def _blocks():
    from transformers import (DeepseekV2Config, DeepseekV3Config, Glm4MoeConfig, MixtralConfig, OlmoeConfig,
                              Qwen2MoeConfig, Qwen3_5MoeConfig, Qwen3MoeConfig)
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMoE
    from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    return {
        "qwen3-moe": Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=64, num_experts=8,
                                                           num_experts_per_tok=2, norm_topk_prob=True)),
        "qwen2-moe (gated shared expert)": Qwen2MoeSparseMoeBlock(Qwen2MoeConfig(
            hidden_size=H, moe_intermediate_size=64, shared_expert_intermediate_size=128, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=False)),
        "mixtral": MixtralSparseMoeBlock(MixtralConfig(hidden_size=H, intermediate_size=128, num_local_experts=8,
                                                       num_experts_per_tok=2)),
        "deepseek-v3 (groups, bias, shared)": DeepseekV3MoE(DeepseekV3Config(
            hidden_size=H, moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=2, n_group=4, topk_group=2,
            num_experts_per_tok=2, routed_scaling_factor=2.5, norm_topk_prob=True)),
        "deepseek-v2 (group-limited greedy)": DeepseekV2Moe(DeepseekV2Config(
            hidden_size=H, moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2,
            topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5)),
        "deepseek-v2 (greedy)": DeepseekV2Moe(DeepseekV2Config(
            hidden_size=H, moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3,
            topk_method="greedy", routed_scaling_factor=1.0)),
        "glm4-moe": Glm4MoeMoE(Glm4MoeConfig(hidden_size=H, moe_intermediate_size=64, n_routed_experts=8,
                                             n_shared_experts=1, n_group=4, topk_group=2, num_experts_per_tok=2,
                                             routed_scaling_factor=2.0)),
        "olmoe": OlmoeSparseMoeBlock(OlmoeConfig(hidden_size=H, intermediate_size=64, num_experts=8,
                                                 num_experts_per_tok=2, norm_topk_prob=False)),
        "qwen3.5-moe (gated shared expert)": Qwen3_5MoeSparseMoeBlock(Qwen3_5MoeConfig(text_config=dict(
            hidden_size=H, moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=8,
            num_experts_per_tok=2)).text_config),
    }


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("name", list(_blocks()))
def test_block_output_matches_transformers(name):
    block = _randomise(_blocks()[name], seed=len(name))
    x = torch.randn(2, 19, H, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        want = block(x)
    moe = from_hf_block(block, max_tokens=64, backend="torch")
    assert rel(moe(x), want) < 1e-2
    d = describe_block(block)["kwargs"]
    if name.startswith("deepseek-v3"):
        assert (d["scoring"], d["n_group"], d["topk_group"], d["routed_scale"], d["shared_inter"]) == \
            ("sigmoid", 4, 2, 2.5, 128)
    if name.startswith("qwen2"):
        assert d["shared_gate"] and not d["norm_topk"]
    if name.startswith("deepseek-v2"):  # softmax, never renormalised, scaled; groups only when group-limited
        assert (d["scoring"], d["norm_topk"], d.get("n_group", 1)) == ("softmax", False, 4 if "group" in name else 1)


def test_whole_model_logits_after_replacing_the_blocks():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=97, hidden_size=H, intermediate_size=128, moe_intermediate_size=64, num_experts=8,
                         num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=32, norm_topk_prob=True)
    torch.manual_seed(0)
    model = _randomise(Qwen3MoeForCausalLM(cfg).eval(), seed=3)
    ids = torch.randint(0, 97, (1, 23), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits
    assert replace_moe_blocks(model, max_tokens=64, backend="torch") == 2
    assert sum(isinstance(m, WeaveMoE) for m in model.modules()) == 2
    with torch.no_grad():
        got = model(ids).logits
    assert rel(got, want) < 3e-2


def test_unsupported_blocks_are_refused():
    block = _randomise(_blocks()["qwen3-moe"], seed=0)
    block.experts.act_fn = torch.nn.GELU()
    with pytest.raises(UnsupportedBlock, match="not SiLU"):
        from_hf_block(block, max_tokens=8, backend="torch")
    block = _randomise(_blocks()["qwen3-moe"], seed=0)
    block.experts.gate_up_proj_bias = torch.nn.Parameter(torch.zeros(8, 128))
    with pytest.raises(UnsupportedBlock, match="biases"):
        from_hf_block(block, max_tokens=8, backend="torch")
    with pytest.raises(UnsupportedBlock, match="no gate"):
        describe_block(torch.nn.Linear(4, 4))
    block = _randomise(_blocks()["qwen3-moe"], seed=0)

    class SomeOtherRouter(torch.nn.Module):  # a router whose rule hf/blocks.py has not read: refused, not guessed
        def __init__(self, w):
            super().__init__()
            self.weight, self.top_k = w, 2

    block.gate = SomeOtherRouter(block.gate.weight)
    with pytest.raises(UnsupportedBlock, match="router SomeOtherRouter is not one"):
        from_hf_block(block, max_tokens=8, backend="torch")


def _qwen3_model(layers=2, **kw):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=97, hidden_size=H, intermediate_size=128, moe_intermediate_size=64, num_experts=8,
                         num_experts_per_tok=2, num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=32, norm_topk_prob=True, **kw)
    torch.manual_seed(0)
    return _randomise(Qwen3MoeForCausalLM(cfg).eval(), seed=3)


def test_zero_width_shared_experts_are_no_shared_expert():
    """DeepSeek-V2 with n_shared_experts=0 and Qwen2-MoE with shared_expert_intermediate_size=0 build shared experts
    of width 0, which add nothing; they used to fail (load_shared on a block without one; shared_gate without a
    shared expert). They become blocks without one and still match transformers."""
    from transformers import DeepseekV2Config, Qwen2MoeConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    blocks = [DeepseekV2Moe(DeepseekV2Config(hidden_size=H, moe_intermediate_size=64, n_routed_experts=8,
                                             n_shared_experts=0, num_experts_per_tok=2, topk_method="greedy")),
              Qwen2MoeSparseMoeBlock(Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=64,
                                                    shared_expert_intermediate_size=0, num_experts=8,
                                                    num_experts_per_tok=2))]
    x = torch.randn(1, 9, H, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for block in blocks:
        block = _randomise(block, seed=5)
        d = describe_block(block)
        assert "shared_inter" not in d["kwargs"] and "shared_gate" not in d["kwargs"] and "shared" not in d["weights"]
        moe = from_hf_block(block, max_tokens=16, backend="torch")
        assert moe.w13s is None
        with torch.no_grad():
            assert rel(moe(x), block(x)) < 1e-2


def test_non_bf16_models_are_refused_before_the_swap():
    """A float32 (or float16) model used to be swapped (its experts silently rounded to bf16) and then fail on its
    first forward (x must be bf16); it is now refused up front, the model unchanged, with the cast to do."""
    for dtype in (torch.float32, torch.float16):
        model = _qwen3_model().to(dtype)
        with pytest.raises(UnsupportedBlock, match=r"experts in torch.float.*model.to\(torch.bfloat16\)"):
            replace_moe_blocks(model, max_tokens=64, backend="torch")
        assert not any(isinstance(m, WeaveMoE) for m in model.modules())
    model = _qwen3_model()  # the cast it asks for is enough
    assert replace_moe_blocks(model.to(torch.bfloat16), max_tokens=64, backend="torch") == 2


def test_replace_is_all_or_nothing():
    """An unsupported block, or one that fails to build, leaves the model as it was (the blocks before it used to
    stay swapped); replacing again finds nothing more; a model without MoE blocks has none to swap."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = _qwen3_model(layers=3)
    model.model.layers[2].mlp.experts.act_fn = torch.nn.GELU()
    originals = [layer.mlp for layer in model.model.layers]
    with pytest.raises(UnsupportedBlock, match="not SiLU"):
        replace_moe_blocks(model, max_tokens=64, backend="torch")
    assert [layer.mlp for layer in model.model.layers] == originals
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    from weave_sim.placement import contiguous

    wide = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=64, num_experts=16, num_experts_per_tok=2)
    model.model.layers[2].mlp = _randomise(Qwen3MoeSparseMoeBlock(wide), seed=6)  # the last block has 16 experts:
    originals = [layer.mlp for layer in model.model.layers]  # the 8-expert placement fits the first two blocks only
    with pytest.raises(ValueError, match="placement of 8 experts over 1 GPUs; this block has 16"):
        replace_moe_blocks(model, max_tokens=64, backend="torch", placement=contiguous(8, 1))
    assert [layer.mlp for layer in model.model.layers] == originals  # the two swapped ones were put back
    assert replace_moe_blocks(model, max_tokens=64, backend="torch") == 3
    assert replace_moe_blocks(model, max_tokens=64, backend="torch") == 0
    dense = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=H, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=32))
    assert replace_moe_blocks(dense, max_tokens=64, backend="torch") == 0


def test_models_that_ask_for_router_logits_are_refused():
    """WeaveMoE returns no router logits; a config with output_router_logits=True used to be swapped and then fail
    every forward with an IndexError inside transformers' load-balancing loss."""
    model = _qwen3_model(output_router_logits=True)
    with pytest.raises(ValueError, match="output_router_logits"):
        replace_moe_blocks(model, max_tokens=64, backend="torch")
    assert not any(isinstance(m, WeaveMoE) for m in model.modules())
    model.config.output_router_logits = False
    assert replace_moe_blocks(model, max_tokens=64, backend="torch") == 2


@pytest.mark.parametrize("argv,match", [
    (["--models", "bogus"], "--models: bogus unknown"),                       # a KeyError traceback before
    (["--tokens", "0"], "must be >= 1"),                                     # a reshape error deep in attention
    (["--repeats", "0"], "must be >= 1"),                                    # an IndexError in median_ms
    (["--backend", "triton"], "invalid choice"),                             # a ValueError traceback from WeaveMoE
    (["--device", "cpu"], "--backend kernel runs the CUDA megakernel"),      # CUDA_HOME not set
    (["--device", "bogus"], "--device 'bogus'"),
] + ([] if torch.cuda.is_available() else [([], "this torch sees no GPU")]))  # default cuda: an AssertionError
def test_hf_e2e_arguments(kernel_script, capsys, argv, match):
    """tests/kernel/hf_e2e.py (the docs' command) refuses bad arguments with a usage line, not a traceback."""
    with pytest.raises(SystemExit) as exc:
        kernel_script("hf_e2e").main(["--tiny", *argv])
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_hf_e2e_cpu_smoke_run(kernel_script, tmp_path):
    """The CPU smoke run docs/kernel.md gives: both tiny models swapped and within the per-block tolerance."""
    import json

    out = tmp_path / "hf_e2e.json"
    assert kernel_script("hf_e2e").main(["--tiny", "--device", "cpu", "--backend", "torch", "--tokens", "16",
                                         "--layers", "1", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["moe_blocks"]) for r in rows] == [("qwen3-moe", 1), ("deepseek-v2-lite", 1)]
    assert all(r["rel_err_last_hidden"] < 1e-2 for r in rows)


def test_blocks_of_one_geometry_share_one_kernel(monkeypatch):
    """On the kernel backend replace_moe_blocks builds one MoEMegakernel per geometry and device: the first block of
    it gets the kernel options, the later ones kernel= its kernel and none of them; share_kernel=False or the torch
    backend build none to share. (from_hf_block is recorded and run on the torch backend: no GPU here; gpu_worker
    runs blocks on one real kernel.)"""
    import weave_kernel.hf.blocks as hf_blocks  # owns from_hf_block, which replace_moe_blocks calls
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    real = hf_blocks.from_hf_block
    calls = []

    def recorded(block, *, max_tokens, **kw):
        calls.append(dict(kw))
        m = real(block, max_tokens=max_tokens, backend="torch")
        m.layer = kw["kernel"] if kw.get("kernel") is not None else object()  # a new "kernel" per build
        return m

    monkeypatch.setattr(hf_blocks, "from_hf_block", recorded)

    def model():
        m = _qwen3_model(layers=4)
        wide = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=64, num_experts=16, num_experts_per_tok=2)
        m.model.layers[2].mlp = _randomise(Qwen3MoeSparseMoeBlock(wide), seed=6)  # another geometry
        return m

    m = model()
    assert replace_moe_blocks(m, max_tokens=64, policy="static:8", timeout_s=1.0) == 4
    blocks = [layer.mlp for layer in m.model.layers]
    assert calls[0] == {"policy": "static:8", "timeout_s": 1.0}
    assert calls[1] == {"policy": "static:8", "kernel": blocks[0].layer}
    assert calls[2] == {"policy": "static:8", "timeout_s": 1.0}  # 16 experts: a kernel of its own
    assert calls[3] == {"policy": "static:8", "kernel": blocks[0].layer}
    assert blocks[1].layer is blocks[0].layer is blocks[3].layer and blocks[2].layer is not blocks[0].layer
    for kw in ({"share_kernel": False}, {"backend": "torch"}):
        calls.clear()
        assert replace_moe_blocks(model(), max_tokens=64, **kw) == 4
        assert all("kernel" not in c for c in calls)


def _hf_rank(rank: int, world: int, port: int, queue) -> None:
    """One rank of test_expert_parallel_model_matches_the_original: the same tiny Qwen3-MoE model on every rank, each
    with its own sequence; the blocks swapped with the experts spread over the ranks (WeaveMoE's torch backend)."""
    import os

    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = _qwen3_model(layers=2)
        ids = torch.randint(0, 97, (1, 9 + 14 * rank), generator=torch.Generator().manual_seed(40 + rank))
        with torch.no_grad():
            want = model(ids).logits
            n = replace_moe_blocks(model, max_tokens=64, backend="torch")
            got = model(ids).logits
        locals_ = [m.local for m in model.modules() if isinstance(m, WeaveMoE)]
        queue.put((rank, n, locals_, rel(got, want)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_expert_parallel_model_matches_the_original():
    """replace_moe_blocks under a process group of 2 (gloo, CPU): each rank keeps half of every block's experts, the
    tokens cross ranks inside each block, and each rank's logits still match the unswapped model's on its sequence."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_hf_rank, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = {r: rest for r, *rest in (queue.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for r, (n, locals_, err) in got.items():
        assert n == 2 and all(loc == [4 * r + i for i in range(4)] for loc in locals_)  # contiguous halves
        assert err < 3e-2, (r, err)
