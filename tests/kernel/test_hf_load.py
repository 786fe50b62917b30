"""weave_kernel.hf.load_model against transformers' own from_pretrained: tiny random MoE models saved with
save_pretrained (experts one by one, as it writes by default; fused, save_original_format=False; sharded), loaded on
CPU with WeaveMoE's torch backend on one rank and on two gloo ranks (contiguous and shuffled placements), with each
rank's reads recorded. Skipped where transformers is not installed (CI installs only what the tests extra lists).

Tolerances: load_model's model equals from_pretrained + replace_moe_blocks bit for bit (every tensor, the logits);
against the unswapped from_pretrained model the logits agree to 3e-2 (relative Frobenius, bf16; test_hf.py's limit
for a swapped model)."""
from __future__ import annotations

import json
import re
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import weave_kernel.hf.checkpoint as hf_checkpoint  # noqa: E402  (owns _safe_open)
from weave_kernel.hf import CheckpointError, UnsupportedBlock, load_model, replace_moe_blocks  # noqa: E402
from weave_kernel.module import WeaveMoE  # noqa: E402

H, V, E = 64, 97, 8
SHUFFLED = [1, 0, 0, 1, 1, 0, 1, 0]  # expert -> rank of the shuffled placement (4 each, not contiguous)
SHARDED = ("qwen3-moe", "deepseek-v3")  # the models also saved in several files


def _configs() -> dict:
    from transformers import (DeepseekV2Config, DeepseekV3Config, MixtralConfig, OlmoeConfig, Qwen2MoeConfig,
                              Qwen3MoeConfig)

    common = dict(vocab_size=V, hidden_size=H, num_attention_heads=2, num_experts_per_tok=2)
    mla = dict(num_key_value_heads=2, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)
    return {  # (config, how many MoE blocks)
        "qwen3-moe": (Qwen3MoeConfig(**common, intermediate_size=128, moe_intermediate_size=64, num_experts=E,
                                     num_hidden_layers=2, num_key_value_heads=1, head_dim=32, norm_topk_prob=True,
                                     tie_word_embeddings=True), 2),
        "qwen2-moe": (Qwen2MoeConfig(**common, intermediate_size=128, moe_intermediate_size=64, num_experts=E,
                                     shared_expert_intermediate_size=64, num_hidden_layers=3, num_key_value_heads=1,
                                     mlp_only_layers=[0], norm_topk_prob=False), 2),
        "mixtral": (MixtralConfig(**common, intermediate_size=64, num_local_experts=E, num_hidden_layers=2,
                                  num_key_value_heads=1, head_dim=32), 2),
        "deepseek-v3": (DeepseekV3Config(**common, **mla, intermediate_size=128, moe_intermediate_size=64,
                                         n_routed_experts=E, n_shared_experts=1, n_group=4, topk_group=2,
                                         routed_scaling_factor=2.5, num_hidden_layers=3, first_k_dense_replace=1,
                                         q_lora_rank=32), 2),
        "deepseek-v2": (DeepseekV2Config(**common, **mla, intermediate_size=128, moe_intermediate_size=64,
                                         n_routed_experts=E, n_shared_experts=2, topk_method="group_limited_greedy",
                                         n_group=4, topk_group=2, routed_scaling_factor=1.5, num_hidden_layers=2,
                                         first_k_dense_replace=0, q_lora_rank=None), 2),
        "olmoe": (OlmoeConfig(**common, intermediate_size=64, num_experts=E, num_hidden_layers=2,
                              num_key_value_heads=1, norm_topk_prob=False), 2),
    }


def _random_model(name: str, cfg, seed: int):
    """Random weights of unit-scale activations (norms stay ones), a random correction bias; Mixtral kept in fp32
    (its checkpoint then rounds to bf16 on load), the others bf16."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        for bname, b in model.named_buffers():
            if "correction_bias" in bname:
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return model if name == "mixtral" else model.to(torch.bfloat16)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """{(model, layout): folder}; layouts "experts" (save_pretrained's default: one tensor per expert and matrix),
    "fused" (save_original_format=False: gate_up_proj / down_proj), "sharded" (one by one, in 20 KB files; two
    models)."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for i, (name, (cfg, _)) in enumerate(_configs().items()):
        model = _random_model(name, cfg, seed=10 + i)
        for layout, kw in (("experts", {}), ("fused", {"save_original_format": False}),
                           ("sharded", {"max_shard_size": "20KB"})):
            if layout == "sharded" and name not in SHARDED:
                continue
            out[name, layout] = root / f"{name}-{layout}"
            model.save_pretrained(out[name, layout], **kw)
    return out


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _ids(seed: int, n: int = 23):
    return torch.randint(0, V, (1, n), generator=torch.Generator().manual_seed(seed))


def _same_tensors(a, b) -> list:
    """Names whose tensors (parameters and buffers) differ in name, dtype, shape or value."""
    ta = dict((*a.named_parameters(remove_duplicate=False), *a.named_buffers(remove_duplicate=False)))
    tb = dict((*b.named_parameters(remove_duplicate=False), *b.named_buffers(remove_duplicate=False)))
    return sorted(set(ta) ^ set(tb)) + [k for k in ta if k in tb and (
        ta[k].dtype != tb[k].dtype or ta[k].shape != tb[k].shape or not torch.equal(ta[k].cpu(), tb[k].cpu()))]


def test_the_checkpoints_have_the_layouts_the_tests_mean(checkpoints):
    """transformers 5.x save_pretrained writes the original per-expert names (Mixtral: block_sparse_moe ... w1), with
    save_original_format=False the fused ones, and max_shard_size splits it with an index."""
    from safetensors import safe_open

    def keys(folder):
        out = []
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), "pt") as h:
                out += list(h.keys())
        return out

    k = keys(checkpoints["mixtral", "experts"])
    assert "model.layers.1.block_sparse_moe.experts.7.w3.weight" in k and not any("gate_up_proj" in x for x in k)
    k = keys(checkpoints["qwen3-moe", "experts"])
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in k and "lm_head.weight" not in k  # tied
    k = keys(checkpoints["deepseek-v3", "fused"])
    assert "model.layers.1.mlp.experts.gate_up_proj" in k and not any(re.search(r"experts\.\d", x) for x in k)
    for name in SHARDED:
        assert len(list(checkpoints[name, "sharded"].glob("*.safetensors"))) > 1
        assert (checkpoints[name, "sharded"] / "model.safetensors.index.json").is_file()


@pytest.mark.parametrize("name,layout", [(n, lay) for n in _configs() for lay in ("experts", "fused")]
                         + [(n, "sharded") for n in SHARDED])
def test_load_model_is_from_pretrained_with_the_blocks_swapped(checkpoints, name, layout):
    """One rank: load_model's model is from_pretrained(dtype=bf16) + replace_moe_blocks, tensor for tensor (renamed
    keys, fp32 routers of DeepSeek, tied embeddings, rotary buffers), and its logits match the unswapped model's."""
    from transformers import AutoModelForCausalLM

    folder = checkpoints[name, layout]
    got = load_model(folder, max_tokens=64, backend="torch", device="cpu")
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    ids = _ids(1)
    with torch.no_grad():
        want = ref(ids).logits
        assert replace_moe_blocks(ref, max_tokens=64, backend="torch") == _configs()[name][1]
        swapped = ref(ids).logits
        logits = got(ids).logits
    assert sum(isinstance(m, WeaveMoE) for m in got.modules()) == _configs()[name][1]
    assert _same_tensors(got, ref) == []
    assert torch.equal(logits, swapped)
    assert rel(logits, want) < 3e-2
    assert not got.training and got.config.name_or_path == str(folder)
    if name == "qwen3-moe":
        assert got.lm_head.weight is got.model.embed_tokens.weight


def test_shared_experts_of_width_zero_are_skipped(tmp_path):
    """DeepSeek-V2 with n_shared_experts=0 and Qwen2-MoE with shared_expert_intermediate_size=0 save their width-0
    shared expert (and Qwen's its [1, H] gate): blocks without a shared expert (as replace_moe_blocks makes them),
    the tensors skipped, the rest equal to from_pretrained + replace_moe_blocks."""
    from transformers import AutoModelForCausalLM, DeepseekV2Config, Qwen2MoeConfig

    cfgs = {"deepseek-v2": DeepseekV2Config(vocab_size=V, hidden_size=H, intermediate_size=128,
                                            moe_intermediate_size=64, n_routed_experts=E, n_shared_experts=0,
                                            num_experts_per_tok=2, topk_method="greedy", num_hidden_layers=1,
                                            num_attention_heads=2,
                                            num_key_value_heads=2, kv_lora_rank=32, qk_nope_head_dim=16,
                                            qk_rope_head_dim=16, v_head_dim=16, q_lora_rank=None,
                                            first_k_dense_replace=0),
            "qwen2-moe": Qwen2MoeConfig(vocab_size=V, hidden_size=H, intermediate_size=128, moe_intermediate_size=64,
                                        shared_expert_intermediate_size=0, num_experts=E, num_experts_per_tok=2,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)}
    for name, cfg in cfgs.items():
        _random_model(name, cfg, seed=3).save_pretrained(tmp_path / name)
        got = load_model(tmp_path / name, max_tokens=64, backend="torch", device="cpu")
        ref = AutoModelForCausalLM.from_pretrained(tmp_path / name, dtype=torch.bfloat16)
        replace_moe_blocks(ref, max_tokens=64, backend="torch")
        assert got.model.layers[0].mlp.w13s is None and _same_tensors(got, ref) == []


class _Recorder:
    """A safetensors handle that records what is read: (key, rows) per read, rows None for a whole tensor."""

    def __init__(self, handle, reads: list):
        self.h, self.reads = handle, reads

    def __enter__(self):
        self.h.__enter__()
        return self

    def __exit__(self, *exc):
        return self.h.__exit__(*exc)

    def keys(self):
        return self.h.keys()

    def get_tensor(self, key):
        t = self.h.get_tensor(key)
        self.reads.append((key, None, t.numel() * t.element_size()))
        return t

    def get_slice(self, key):
        sl, reads = self.h.get_slice(key), self.reads

        class Slice:
            def get_shape(self):
                return sl.get_shape()

            def get_dtype(self):
                return sl.get_dtype()

            def __getitem__(self, idx):
                t = sl[idx]
                rows = range(*idx.indices(sl.get_shape()[0])) if isinstance(idx, slice) else idx
                reads.append((key, list(rows), t.numel() * t.element_size()))
                return t

        return Slice()


def _experts_read(reads: list, block: str) -> set:
    """The expert ids of `block` whose bytes were read (a whole fused tensor counts as all)."""
    out = set()
    for key, rows, _ in reads:
        key = key.replace(".block_sparse_moe.", ".mlp.")  # Mixtral's name on disk
        m = re.search(rf"{re.escape(block)}\.experts\.(\d+)\.", key)
        if m:
            out.add(int(m.group(1)))
        elif re.search(rf"{re.escape(block)}\.experts\.(gate_up_proj|down_proj)$", key):
            out |= set(range(E)) if rows is None else set(rows)
    return out


def _checkpoint_bytes(folder) -> tuple[int, int]:
    """(bytes of the routed experts' tensors, bytes of all tensors) in a checkpoint."""
    from safetensors import safe_open

    experts = total = 0
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                t = h.get_tensor(k)
                n = t.numel() * t.element_size()
                total += n
                experts += n if re.search(r"\.experts\.", k) else 0
    return experts, total


# (model, layout, placement) of the two-rank test
TWO_RANK_CASES = [("qwen3-moe", "experts", "contiguous"), ("qwen3-moe", "fused", "shuffled"),
                  ("deepseek-v3", "sharded", "shuffled"),
                  ("mixtral", "experts", "shuffled"), ("qwen2-moe", "fused", "shuffled")]


def _load_rank(rank: int, world: int, port: int, folders: dict, queue) -> None:
    """One rank of test_two_ranks_read_only_their_experts."""
    import os

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from weave_sim.placement import contiguous, explicit

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for case in TWO_RANK_CASES:
            name, layout, kind = case
            placement = contiguous(E, world) if kind == "contiguous" else explicit(SHUFFLED, world)
            reads = []
            real = hf_checkpoint._safe_open
            hf_checkpoint._safe_open = lambda f: _Recorder(real(f), reads)
            try:
                got = load_model(folders[case], max_tokens=64, backend="torch", device="cpu", placement=placement)
            finally:
                hf_checkpoint._safe_open = real
            ref = AutoModelForCausalLM.from_pretrained(folders[case], dtype=torch.bfloat16)
            ids = _ids(40 + rank, 9 + 14 * rank)  # each rank its own sequence
            with torch.no_grad():
                want = ref(ids).logits
                replace_moe_blocks(ref, max_tokens=64, backend="torch", placement=placement)
                swapped = ref(ids).logits
                logits = got(ids).logits
            blocks = {n: m.local for n, m in got.named_modules() if isinstance(m, WeaveMoE)}
            read = {n: sorted(_experts_read(reads, n)) for n in blocks}
            expert_bytes = sum(b for k, _, b in reads if ".experts." in k)
            queue.put((rank, case, dict(blocks=blocks, read=read, same=_same_tensors(got, ref),
                                        equal=torch.equal(logits, swapped), err=rel(logits, want),
                                        expert_bytes=expert_bytes, bytes=sum(b for *_, b in reads))))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_ranks_read_only_their_experts(checkpoints):
    """load_model under a process group of 2 (gloo, CPU): each rank reads every non-expert tensor and only the rows
    of its own experts (contiguous halves, or the shuffled placement), in either layout; its model equals
    from_pretrained + replace_moe_blocks with the same placement, and its logits match the unswapped model's."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folders = {c: checkpoints[c[0], c[1]] for c in TWO_RANK_CASES}
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_load_rank, args=(r, 2, port, folders, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = {(r, case): res for r, case, res in (queue.get(timeout=300) for _ in range(2 * len(TWO_RANK_CASES)))}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for (rank, (name, layout, kind)), res in got.items():
        own = [e for e in range(E) if (SHUFFLED[e] if kind == "shuffled" else e // 4) == rank]
        assert len(res["blocks"]) == _configs()[name][1]
        for block, local in res["blocks"].items():
            assert local == own and res["read"][block] == own, (rank, name, block, res["read"][block])
        assert res["same"] == [] and res["equal"], (rank, name, res["same"][:3])
        assert res["err"] < 3e-2, (rank, name, res["err"])
        experts, total = _checkpoint_bytes(folders[name, layout, kind])
        assert res["expert_bytes"] == experts // 2  # its half of the experts, nothing of the others
        assert res["bytes"] == total - experts // 2, (rank, name)  # and every other tensor once


# ---- errors ---------------------------------------------------------------------------------------------------------

def _rewrite(src, dst, drop=(), add=None, change=None):
    """A copy of the single-file checkpoint `src` in `dst`, without the keys in drop, with the tensors in add, and
    the tensors in change replaced."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    for k in drop:
        del tensors[k]
    tensors.update(add or {})
    tensors.update(change or {})
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_a_missing_tensor_is_named(checkpoints, tmp_path):
    src = checkpoints["qwen3-moe", "experts"]
    for key in ("model.layers.1.mlp.experts.5.up_proj.weight", "model.norm.weight", "model.layers.0.mlp.gate.weight"):
        folder = _rewrite(src, tmp_path / key, drop=[key])
        with pytest.raises(CheckpointError, match=f"has no {re.escape(key)}"):
            load_model(folder, max_tokens=64, backend="torch", device="cpu")
    folder = _rewrite(checkpoints["mixtral", "experts"], tmp_path / "mixtral",
                      drop=["model.layers.0.block_sparse_moe.experts.2.w2.weight"])
    with pytest.raises(CheckpointError, match=r"has no model\.layers\.0\.mlp\.experts\.2\.w2\.weight"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")
    folder = _rewrite(checkpoints["deepseek-v3", "fused"], tmp_path / "dsv3",
                      drop=["model.layers.1.mlp.gate.e_score_correction_bias"])
    with pytest.raises(CheckpointError, match=r"has no model\.layers\.1\.mlp\.gate\.e_score_correction_bias"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")
    folder = _rewrite(checkpoints["deepseek-v3", "fused"], tmp_path / "dsv3-experts",
                      drop=["model.layers.2.mlp.experts.gate_up_proj", "model.layers.2.mlp.experts.down_proj"])
    with pytest.raises(CheckpointError, match=r"no experts for model\.layers\.2\.mlp"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")


def test_unexpected_misshapen_and_quantized_tensors_are_refused(checkpoints, tmp_path):
    src = checkpoints["qwen3-moe", "experts"]
    scale = "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv"  # an FP8 checkpoint's scales
    folder = _rewrite(src, tmp_path / "scale", add={scale: torch.ones(1, 1)})
    with pytest.raises(CheckpointError, match=f"no place for: {re.escape(scale)}"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")
    folder = _rewrite(src, tmp_path / "extra", add={"model.layers.0.mlp.experts.8.up_proj.weight": torch.ones(64, 64)})
    with pytest.raises(CheckpointError, match=r"experts\.8, and the block has 8 experts"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")
    folder = _rewrite(src, tmp_path / "shape", change={"model.layers.1.mlp.experts.3.down_proj.weight":
                                                       torch.ones(64, 32, dtype=torch.bfloat16)})
    with pytest.raises(CheckpointError, match=r"experts\.3\.down_proj\.weight .* is \[64, 32\]; expert 3's down_proj"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")
    folder = _rewrite(src, tmp_path / "fp8", change={"model.layers.1.mlp.experts.3.down_proj.weight":
                                                     torch.ones(64, 64).to(torch.float8_e4m3fn)})
    with pytest.raises(CheckpointError, match="is F8_E4M3; load_model reads unquantized"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")
    fused = checkpoints["qwen3-moe", "fused"]  # both layouts of one block
    folder = _rewrite(fused, tmp_path / "both",
                      add={"model.layers.0.mlp.experts.0.gate_proj.weight": torch.ones(64, 64, dtype=torch.bfloat16)})
    with pytest.raises(CheckpointError, match="both fused .* and one by one"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")
    cfg = json.loads((src / "config.json").read_text())
    # (DeepSeek-V3's block FP8, 128 x 128, is read: tests/kernel/test_module_fp8.py)
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [64, 64]}
    folder = tmp_path / "quantized"
    shutil.copytree(src, folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"is quantized.*weight_block_size \[64, 64\], not \[128, 128\]"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")


def test_bad_paths_unsupported_blocks_and_router_logits_are_refused(checkpoints, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_model(tmp_path / "nowhere", max_tokens=64, backend="torch", device="cpu")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path, max_tokens=64, backend="torch", device="cpu")
    src = checkpoints["qwen3-moe", "experts"]
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(src / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="it has pytorch_model.bin; load_model reads safetensors only"):
        load_model(folder, max_tokens=64, backend="torch", device="cpu")
    sharded = tmp_path / "sharded"
    shutil.copytree(checkpoints["qwen3-moe", "sharded"], sharded)
    victim = sorted(sharded.glob("*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=f"names {victim.name}, which is not in"):
        load_model(sharded, max_tokens=64, backend="torch", device="cpu")
    cfg = transformers.AutoConfig.from_pretrained(src)
    cfg.hidden_act = "gelu"  # the experts' activation: not what the kernel computes
    with pytest.raises(UnsupportedBlock, match="not SiLU"):
        load_model(src, max_tokens=64, backend="torch", device="cpu", config=cfg)
    cfg = transformers.AutoConfig.from_pretrained(src)
    cfg.output_router_logits = True
    with pytest.raises(ValueError, match="output_router_logits=False"):
        load_model(src, max_tokens=64, backend="torch", device="cpu", config=cfg)
    cfg.output_router_logits = False  # config= is how to change it
    assert isinstance(load_model(src, max_tokens=64, backend="torch", device="cpu", config=cfg).model.layers[0].mlp,
                      WeaveMoE)
