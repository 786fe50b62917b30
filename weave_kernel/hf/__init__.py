"""Hugging Face transformers MoE blocks -> WeaveMoE, by the blocks' structure (transformers 5.x layout).

    from weave_kernel.hf import load_model
    model = load_model(folder, max_tokens=8192, group=ep_group)   # each rank reads only its own experts
    from weave_kernel.hf import replace_moe_blocks
    n = replace_moe_blocks(model, max_tokens=8192)     # every supported MoE block of a loaded model, in place
    from weave_kernel.hf import from_hf_block
    moe = from_hf_block(model.model.layers[3].mlp, max_tokens=8192, backend="torch")

load_model builds the model from the folder's config.json on the meta device, swaps its MoE blocks, and then reads
the safetensors files (one or sharded): every non-expert tensor whole, and of each block's routed experts only the
rows of this rank's (moe.local; any placement), from either layout: fused experts.gate_up_proj / down_proj (what
transformers 5.x holds, and writes with save_pretrained(save_original_format=False)) or one tensor per expert and
matrix (experts.<e>.gate_proj / up_proj / down_proj.weight; Mixtral's block_sparse_moe.experts.<e>.w1 / w3 / w2: the
original checkpoints, and save_pretrained's default). A rank's host memory is then the non-expert weights plus its
own experts, not the checkpoint. The model equals from_pretrained(folder, dtype=torch.bfloat16) followed by
replace_moe_blocks, tensor for tensor (tests/kernel/test_hf_load.py: Qwen3-MoE, Qwen2-MoE, Mixtral, DeepSeek-V2,
DeepSeek-V3, OLMoE; 1 and 2 ranks). A tensor it cannot place, or one the model needs and the checkpoint lacks,
raises CheckpointError naming it.

FP8 checkpoints of DeepSeek-V3's format (config quantization_config {"quant_method": "fp8", "weight_block_size":
[128, 128]}, dynamic activation scales; DeepSeek-V3, Qwen3-MoE-FP8, ...): a float8_e4m3fn tensor `<name>` comes with
`<name>_scale_inv`, one fp32 multiplier per 128 x 128 block ([ceil(N/128), ceil(K/128)]). The routed experts and the
shared expert (DeepSeek-V3's shared_experts) load into FP8 WeaveMoE blocks (expert_dtype="fp8", the default for such a
checkpoint) as they are, e4m3 and scales, without requantization (WeaveMoE.load_experts_fp8 / load_shared_fp8);
every other FP8 tensor (attention, dense MLPs) is dequantized (q * s in fp32, then the model's dtype; edges that are
not multiples of 128 padded and cropped: dequant_fp8_weight). With expert_dtype="bf16" the experts and the shared
expert are dequantized too. Other quantizations are refused.

A block qualifies when it has
- `gate`: one of the routers in ROUTERS (Mixtral, Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE, OLMoE, DeepSeek-V2,
  DeepSeek-V3, GLM-4-MoE), whose rule (softmax or sigmoid scores, renormalised or not, scaled, group-limited, with a
  correction bias) WeaveMoE reproduces; its settings (top_k, norm_topk_prob, n_group, ...) are read from it;
- `experts` with `gate_up_proj` [E, 2I, H] (gate rows first) and `down_proj` [E, H, I], SiLU activation, no biases;
- optionally `shared_experts` (DeepSeek) or `shared_expert` (Qwen) with gate_proj / up_proj / down_proj Linears
  without bias, and `shared_expert_gate` (a Linear H -> 1: the shared row weighted by its sigmoid).
Anything else (expert biases, other activations, routers with other rules) raises UnsupportedBlock rather than
computing something else. The router's logits are computed in the dtype the checkpoint's code uses (float32 for
DeepSeek-V3's router, the router weight's dtype otherwise), so near-ties break the same way.
"""
from .blocks import ROUTERS, UnsupportedBlock, describe_block, from_hf_block, load_block_weights, replace_moe_blocks
from .checkpoint import CheckpointError, dequant_fp8_weight, load_model

__all__ = ["UnsupportedBlock", "CheckpointError", "ROUTERS", "describe_block", "load_block_weights", "from_hf_block",
           "replace_moe_blocks", "dequant_fp8_weight", "load_model"]
