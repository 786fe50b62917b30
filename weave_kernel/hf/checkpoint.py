"""A model loaded from a local safetensors checkpoint with each expert-parallel rank reading only its own experts:
load_model, dequant_fp8_weight (the package docstring, weave_kernel.hf, describes the layouts and FP8 checkpoints)."""
from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

import torch

from ..fp8 import BLOCK as FP8_BLOCK
from ..module import WeaveMoE
from ..validate import full_device
from .blocks import _geometry, _moe_targets, _refuse_router_logits, _sharing, describe_block


class CheckpointError(ValueError):
    """The checkpoint does not hold what the model needs (a missing, unexpected, misshapen or quantized tensor)."""


# The per-expert names of original checkpoints: gate (W1), up (W3), down (W2); Mixtral's w1 / w3 / w2.
_EXPERT_PARTS = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": 2, "w2": 2}
_PER_EXPERT = re.compile(r"experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight")
_FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")
_FP8_DTYPE = "F8_E4M3"     # safetensors' name of float8_e4m3fn
_SCALE_SUFFIX = "_scale_inv"  # DeepSeek-V3: <name> e4m3, <name>_scale_inv its fp32 block scales


def _blocks(n: int) -> int:
    return -(-n // FP8_BLOCK)


def dequant_fp8_weight(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A DeepSeek-V3-style FP8 weight in `dtype`: q [..., N, K] float8_e4m3fn, s [..., ceil(N/128), ceil(K/128)] its
    scales (weight_scale_inv: value = q * s per 128 x 128 block), computed in fp32 (fp8.dequant_weight) and rounded
    once. N and K need not be multiples of 128 (DeepSeek-V3's kv_a_proj_with_mqa has 576 rows): q is padded with
    zeros to whole blocks and the result cropped."""
    from ..fp8 import FP8, dequant_weight

    if q.dtype != FP8 or q.dim() < 2:
        raise ValueError(f"dequant_fp8_weight: q must be float8_e4m3fn [..., N, K], got {q.dtype} {list(q.shape)}")
    n, k = q.shape[-2:]
    want = (*q.shape[:-2], _blocks(n), _blocks(k))
    if tuple(s.shape) != want or not s.is_floating_point():
        raise ValueError(f"dequant_fp8_weight: the scales of a {list(q.shape)} weight must be float {list(want)} "
                         f"(one per 128 x 128 block), got {s.dtype} {list(s.shape)}")
    pn, pk = want[-2] * FP8_BLOCK - n, want[-1] * FP8_BLOCK - k
    if pn or pk:  # (byte 0 is e4m3 +0)
        q = torch.nn.functional.pad(q.view(torch.uint8), (0, pk, 0, pn)).view(FP8)
    return dequant_weight(q, s.float())[..., :n, :k].to(dtype)


def _fp8_config(qc, path) -> bool:
    """True for a quantization_config load_model reads (DeepSeek-V3-style block FP8); CheckpointError otherwise."""
    d = qc if isinstance(qc, dict) else (qc.to_dict() if hasattr(qc, "to_dict") else vars(qc))
    why = []
    if d.get("quant_method") != "fp8":
        why.append(f"quant_method {d.get('quant_method')!r}, not 'fp8'")
    block = d.get("weight_block_size")
    if block is None or list(block) != [FP8_BLOCK, FP8_BLOCK]:
        why.append(f"weight_block_size {block}, not [{FP8_BLOCK}, {FP8_BLOCK}]")
    if (d.get("activation_scheme") or "dynamic") != "dynamic":
        why.append(f"activation_scheme {d.get('activation_scheme')!r}, not 'dynamic' (static activation scales)")
    if d.get("fmt") not in (None, "e4m3"):
        why.append(f"fmt {d.get('fmt')!r}, not 'e4m3'")
    if d.get("weight_scale_format") not in (None, "float32", "fp32"):  # (UE8M0 scales)
        why.append(f"weight_scale_format {d.get('weight_scale_format')!r}")
    if why:
        raise CheckpointError(f"load_model: {path} is quantized ({d}); load_model reads unquantized checkpoints and "
                              f"DeepSeek-V3-style FP8 ones (quant_method 'fp8', weight_block_size [128, 128], dynamic "
                              f"activations, e4m3 weights with fp32 weight_scale_inv), and this one has "
                              f"{'; '.join(why)}")
    return True


def _safe_open(file: Path):
    """A safetensors file, memory-mapped; load_model reads every tensor through it (keys, get_slice, get_tensor)."""
    from safetensors import safe_open

    return safe_open(str(file), framework="pt", device="cpu")


def _checkpoint_files(path: Path) -> list[Path]:
    if not path.is_dir():
        raise FileNotFoundError(f"load_model: {str(path)!r} is not a directory; it takes a local checkpoint "
                                f"folder (config.json and *.safetensors; for a Hub model, the folder "
                                f"huggingface_hub.snapshot_download returns)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"load_model: no config.json in {path}")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        names = ["model.safetensors"]
    else:
        other = sorted(f.name for f in path.iterdir() if f.suffix in (".bin", ".pt", ".pth", ".gguf"))
        has = f" (it has {', '.join(other[:3])}; load_model reads safetensors only)" if other else ""
        raise FileNotFoundError(f"load_model: no model.safetensors or model.safetensors.index.json in {path}{has}")
    files = [path / n for n in names]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"load_model: {index.name} names {f.name}, which is not in {path}")
    return files


def _renamer(model):
    """checkpoint key -> the model's key, by the renamings transformers applies when it loads this model (e.g.
    Mixtral's block_sparse_moe -> mlp, a missing or extra base-model prefix). Its converters (the per-expert ->
    fused expert merges) are not applied: load_model reads experts itself."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    meta = model.state_dict()
    prefix = model.base_model_prefix

    def rename(key: str) -> str:
        renamed, _ = rename_source_key(key, renamings, [], prefix, meta)
        if renamed not in meta and key in meta:  # as transformers does: the key needed no renaming
            renamed, _ = rename_source_key(key, [], [], prefix, meta)
        return renamed

    return rename


def _dtype_rule(model, dtype: torch.dtype):
    """(model key, its meta dtype) -> the dtype from_pretrained(dtype=) gives it: float32 for the modules the model
    keeps in fp32 (DeepSeek's and GLM's router weight and correction bias), else the dtype it was built in."""
    plan = model._get_dtype_plan(dtype)
    if not plan:
        return lambda key, meta_dtype: meta_dtype
    from transformers.core_model_loading import build_glob_alternation

    alternation, by_group, _ = build_glob_alternation(list(plan))

    def rule(key: str, meta_dtype: torch.dtype) -> torch.dtype:
        m = alternation.search(key)
        return plan[by_group[m.lastgroup]] if m else meta_dtype

    return rule


def _set_tensor(model, key: str, value: torch.Tensor) -> None:
    """Put `value` in place of the model's (meta) parameter or buffer `key`, marked loaded (transformers'
    initialize_weights then leaves it alone)."""
    path, _, name = key.rpartition(".")
    mod = model.get_submodule(path) if path else model
    if name in mod._buffers:
        mod._buffers[name] = value
    else:
        value = torch.nn.Parameter(value, requires_grad=value.is_floating_point())
        mod._parameters[name] = value
    value._is_hf_initialized = True


def _runs(local: list) -> list:
    """(local index, global id, count) of the runs of consecutive experts in `local` (one slice read each)."""
    runs = []
    for j, e in enumerate(local):
        if runs and runs[-1][1] + runs[-1][2] == e:
            runs[-1][2] += 1
        else:
            runs.append([j, e, 1])
    return runs


def _plan(model, targets: list, descs: list, shapes: dict, path: Path, fp8: bool = False) -> dict:
    """Which checkpoint tensor fills what, from the checkpoint's keys, shapes and dtypes only (no tensor data is
    read, so every rank finds the same errors before any collective). Raises CheckpointError. fp8 (an FP8
    checkpoint): a tensor `<k>` with a sibling `<k>_scale_inv` may be e4m3; "scales" maps it to that sibling."""
    rename, meta = _renamer(model), model.state_dict()
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    ignore = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    buffers = [n for n, _ in model.named_buffers()]
    if any(n.endswith("rotary_emb.inv_freq") for n in buffers):  # what transformers also ignores
        ignore.add(r"rotary_emb\.inv_freq")
    if any(n.endswith("position_ids") for n in buffers):
        ignore.add(r"(^|\.)position_ids$")
    ignored = re.compile("|".join(f"({p})" for p in ignore)) if ignore else None
    prefix_of = {name + ".": i for i, (name, _) in enumerate(targets)}
    roles = []
    for d in descs:
        r = {n: role for role, n in d["names"].items() if role not in ("shared", "unused")}
        r.update({n: ("shared", j) for j, n in enumerate(d["names"].get("shared", ()))})
        r.update(dict.fromkeys(d["names"].get("unused", ()), "unused"))
        roles.append(r)
    blocks = [{"roles": {}, "experts": {}} for _ in targets]
    dense, unexpected = {}, []
    scales = {}  # e4m3 tensor's checkpoint key -> its scales' key (FP8 checkpoints)
    if fp8:
        for ckpt_key in shapes:
            base = ckpt_key[:-len(_SCALE_SUFFIX)]
            if ckpt_key.endswith(_SCALE_SUFFIX) and base in shapes:
                scales[base] = ckpt_key
    scale_keys = set(scales.values())

    def block_of(key: str):
        parts = key.split(".")
        for n in range(len(parts) - 1, 0, -1):
            i = prefix_of.get(".".join(parts[:n]) + ".")
            if i is not None:
                return i, ".".join(parts[n:])
        return None, None

    def put(into: dict, k, ckpt_key: str) -> None:
        if k in into:
            raise CheckpointError(f"load_model: {into[k]} and {ckpt_key} in {path} both hold {k}")
        into[k] = ckpt_key

    for ckpt_key in sorted(shapes):
        if ckpt_key in scale_keys:
            continue  # read with its tensor
        key = rename(ckpt_key)
        i, rel = block_of(key)
        if i is not None:
            m = _PER_EXPERT.fullmatch(rel)
            if roles[i].get(rel) == "unused":
                pass  # a shared expert of width 0, or its gate
            elif rel in roles[i]:
                put(blocks[i]["roles"], roles[i][rel], ckpt_key)
            elif m:
                put(blocks[i]["experts"], (int(m.group(1)), _EXPERT_PARTS[m.group(2)]), ckpt_key)
                blocks[i].setdefault("style", m.group(2))
            else:
                unexpected.append(ckpt_key)
        elif key in tied:
            pass  # from_pretrained would load it and tie over it
        elif key in meta:
            put(dense, key, ckpt_key)
        elif not (ignored and (ignored.search(key) or ignored.search(ckpt_key))):
            unexpected.append(ckpt_key)
    if unexpected:
        raise CheckpointError(f"load_model: {len(unexpected)} tensor(s) in {path} that this "
                              f"{type(model).__name__} has no place for: {', '.join(unexpected[:5])}"
                              f"{' ...' if len(unexpected) > 5 else ''}")

    def check(ckpt_key: str, want: tuple, what: str) -> None:
        shape, dt = shapes[ckpt_key]
        if tuple(shape) != tuple(want):
            raise CheckpointError(f"load_model: {ckpt_key} in {path} is {list(shape)}; {what} is {list(want)}")
        if ckpt_key in scales:
            sk = scales[ckpt_key]
            s_shape, s_dt = shapes[sk]
            if dt != _FP8_DTYPE:
                raise CheckpointError(f"load_model: {ckpt_key} in {path} is {dt} and has block scales {sk}; scales go "
                                      f"with {_FP8_DTYPE} tensors")
            want_s = (*want[:-2], _blocks(want[-2]), _blocks(want[-1])) if len(want) >= 2 else None
            if want_s is None or tuple(s_shape) != want_s or s_dt not in _FLOAT_DTYPES:
                raise CheckpointError(f"load_model: {sk} in {path} is {s_dt} {list(s_shape)}; the 128 x 128 block "
                                      f"scales of {what} are float {list(want_s) if want_s else '(none: not 2-D)'}")
            return
        if fp8 and dt == _FP8_DTYPE:
            raise CheckpointError(f"load_model: {ckpt_key} in {path} is {dt} without its block scales "
                                  f"{ckpt_key}{_SCALE_SUFFIX}")
        if dt not in _FLOAT_DTYPES:
            raise CheckpointError(f"load_model: {ckpt_key} in {path} is {dt}; load_model reads unquantized "
                                  f"checkpoints ({', '.join(_FLOAT_DTYPES)}) and DeepSeek-V3-style FP8 ones (config "
                                  f"quantization_config quant_method 'fp8', e4m3 tensors with <name>{_SCALE_SUFFIX})")

    block_prefixes = tuple(prefix_of)
    for key, t in meta.items():
        if key.startswith(block_prefixes) or key in tied:
            continue
        if key not in dense:
            raise CheckpointError(f"load_model: {path} has no {key} (the model's {tuple(t.shape)} tensor; names "
                                  f"as the model has them, after transformers' renamings)")
        check(dense[key], tuple(t.shape), key)
    for (name, mod), d, b in zip(targets, descs, blocks):
        kw, w = d["kwargs"], d["weights"]
        E, H, I = kw["num_experts"], kw["hidden"], kw["inter"]
        need = [r for r in d["names"] if r not in ("gate_up", "down", "unused")]
        for role in need:
            for j, n in enumerate(d["names"][role] if role == "shared" else (d["names"][role],)):
                r = ("shared", j) if role == "shared" else role
                if r not in b["roles"]:
                    raise CheckpointError(f"load_model: {path} has no {name}.{n}")
                check(b["roles"][r], tuple((w[role][j] if role == "shared" else w[role]).shape), f"{name}.{n}")
        fused = [r for r in ("gate_up", "down") if r in b["roles"]]
        if fused and b["experts"]:
            raise CheckpointError(f"load_model: {path} holds {name}'s experts both fused ({b['roles'][fused[0]]}) "
                                  f"and one by one ({next(iter(b['experts'].values()))})")
        if fused:
            for r, want in (("gate_up", (E, 2 * I, H)), ("down", (E, H, I))):
                if r not in b["roles"]:
                    raise CheckpointError(f"load_model: {path} has no {name}.{d['names'][r]}")
                check(b["roles"][r], want, f"{name}.{d['names'][r]}")
            b["layout"] = "fused"
        elif b["experts"]:
            names = ("w1", "w3", "w2") if b["style"] in ("w1", "w3", "w2") else ("gate_proj", "up_proj", "down_proj")
            beyond = sorted(e for e, _ in b["experts"] if e >= E)
            if beyond:
                raise CheckpointError(f"load_model: {path} has {name}.experts.{beyond[0]}, and the block has {E} "
                                      f"experts")
            for e in range(E):
                for part, want in enumerate(((I, H), (I, H), (H, I))):
                    if (e, part) not in b["experts"]:
                        raise CheckpointError(f"load_model: {path} has no {name}.experts.{e}.{names[part]}.weight")
                    check(b["experts"][(e, part)], want, f"expert {e}'s {names[part]} of {name}")
            b["layout"] = "per-expert"
        else:
            raise CheckpointError(f"load_model: {path} has no experts for {name}: neither {name}.experts.gate_up_proj "
                                  f"/ down_proj (fused) nor {name}.experts.<e>.gate_proj.weight / up_proj / down_proj "
                                  f"(one by one; Mixtral's w1 / w3 / w2)")
    return {"dense": dense, "blocks": blocks, "scales": scales}


def load_model(path, *, max_tokens: int, group=None, device=None, config=None, share_kernel: bool = True,
               **kwargs) -> torch.nn.Module:
    """The causal LM of a local safetensors checkpoint (`path`: config.json and model.safetensors or a sharded
    model.safetensors.index.json) in bf16, its MoE blocks WeaveMoE, with this rank reading only what it keeps: every
    non-expert tensor whole, and of the routed experts only the rows of its own (moe.local, by the placement; any
    placement). kwargs go to WeaveMoE (backend, placement, policy, expert_dtype, ...), as in replace_moe_blocks, and so
    does group
    (the expert-parallel process group); device (default: the current CUDA device, else the CPU) holds the whole
    model. config replaces the checkpoint's config.json (e.g. with output_router_logits=False).

    Experts may be stored fused (experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I], as transformers 5.x holds
    them and writes with save_pretrained(save_original_format=False)) or one by one (experts.<e>.gate_proj / up_proj
    / down_proj.weight, Mixtral's block_sparse_moe.experts.<e>.w1 / w3 / w2: the original checkpoints, and what
    save_pretrained writes by default). The other tensors get what from_pretrained(path, dtype=torch.bfloat16)
    gives them: its renamings, fp32 where the model keeps them in fp32, tied embeddings, buffers computed as it
    computes them. Everything is checked before anything is read or built (every rank finds the same errors): a
    missing, unexpected, misshapen or quantized tensor raises CheckpointError naming it, an unsupported block
    UnsupportedBlock; and no parameter or buffer is left unloaded.

    FP8 checkpoints (module docstring): the blocks are expert_dtype="fp8" unless kwargs say "bf16", and take the
    checkpoint's e4m3 experts and scales as they are (an expert stored in bf16 is quantized, fp8.quantize_weight); with
    "bf16" the experts are dequantized (dequant_fp8_weight). A shared expert goes the same way: kept in e4m3 with its
    scales in an FP8 block (load_shared_fp8; a part stored unquantized is quantized), dequantized in a bf16 one. Every
    other e4m3 tensor is dequantized to the model's dtype. An unquantized checkpoint loads into FP8 blocks too with
    expert_dtype="fp8" (experts and shared expert quantized)."""
    import copy

    import transformers

    path = Path(path)
    files = _checkpoint_files(path)
    config = transformers.AutoConfig.from_pretrained(path) if config is None else copy.deepcopy(config)
    fp8 = False
    if getattr(config, "quantization_config", None):
        fp8 = _fp8_config(config.quantization_config, path)
        try:  # the model is built unquantized (bf16, its experts WeaveMoE's); load_model reads the FP8 tensors
            del config.quantization_config
        except AttributeError:
            config.quantization_config = None
    from ..buffers import check_expert_dtype

    expert_dtype = check_expert_dtype(kwargs.pop("expert_dtype", "fp8" if fp8 else "bf16"))
    config.name_or_path = str(path)
    dev = full_device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    targets = _moe_targets(model)
    _refuse_router_logits(model, targets, "pass config= with output_router_logits=False")
    descs = [describe_block(mod) for _, mod in targets]
    dtype_of = _dtype_rule(model, torch.bfloat16)
    meta = model.state_dict()
    with ExitStack() as stack:
        handles, shapes = {}, {}
        for f in files:
            h = stack.enter_context(_safe_open(f))
            for k in h.keys():
                if k in handles:
                    raise CheckpointError(f"load_model: {k} is in two files of {path}")
                sl = h.get_slice(k)
                handles[k], shapes[k] = h, (tuple(sl.get_shape()), sl.get_dtype())
        plan = _plan(model, targets, descs, shapes, path, fp8)
        scales = plan["scales"]

        share, own = _sharing(kwargs, share_kernel)  # the blocks, as replace_moe_blocks builds them (collective)
        kernels, moes = {}, []
        for d in descs:
            key = _geometry(d, dev) if share else None
            if key in kernels:
                moe = WeaveMoE(**d["kwargs"], max_tokens=max_tokens, group=group, device=dev, kernel=kernels[key],
                               expert_dtype=expert_dtype, **own)
            else:
                moe = WeaveMoE(**d["kwargs"], max_tokens=max_tokens, group=group, device=dev,
                               expert_dtype=expert_dtype, **kwargs)
                if key is not None:
                    kernels[key] = moe.layer
            moes.append(moe)
        for (name, _), moe in zip(targets, moes):
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, moe)

        def read(ckpt_key: str, model_key: str) -> torch.Tensor:
            t = handles[ckpt_key].get_tensor(ckpt_key)
            dtype = dtype_of(model_key, meta[model_key].dtype)
            if ckpt_key in scales:  # e4m3: dequantized
                sk = scales[ckpt_key]
                return dequant_fp8_weight(t.to(dev), handles[sk].get_tensor(sk).to(dev), dtype)
            return t.to(device=dev, dtype=dtype)

        def expert_part(moe: WeaveMoE, ckpt_key: str, lo: int | None = None, hi: int | None = None):
            """An expert tensor (rows [lo, hi) of a fused one) as moe wants it: (e4m3, scales) for FP8 blocks
            (quantized if the checkpoint has it unquantized), (bf16, None) for bf16 blocks (dequantized if e4m3)."""
            t = handles[ckpt_key].get_tensor(ckpt_key) if lo is None else handles[ckpt_key].get_slice(ckpt_key)[lo:hi]
            s = None
            if ckpt_key in scales:
                sk = scales[ckpt_key]
                s = handles[sk].get_tensor(sk) if lo is None else handles[sk].get_slice(sk)[lo:hi]
            return _expert_as(moe, t, s)

        def shared_part(ckpt_key: str, model_key: str) -> tuple:
            """A shared expert's tensor for an FP8 block: (e4m3, scales) as stored, or quantized from what
            from_pretrained would give the model (read), as replace_moe_blocks would quantize it."""
            if ckpt_key in scales:
                sk = scales[ckpt_key]
                return (handles[ckpt_key].get_tensor(ckpt_key).to(dev),
                        handles[sk].get_tensor(sk).to(device=dev, dtype=torch.float32))
            from ..fp8 import quantize_weight

            return quantize_weight(read(ckpt_key, model_key))

        with torch.no_grad():
            for key, ckpt_key in plan["dense"].items():
                _set_tensor(model, key, read(ckpt_key, key))
            for (name, _), d, b, moe in zip(targets, descs, plan["blocks"], moes):
                r, n = b["roles"], d["names"]
                moe.load_router(read(r["router"], f"{name}.{n['router']}"),
                                read(r["score_bias"], f"{name}.{n['score_bias']}") if "score_bias" in r else None)
                if "shared" in n:
                    gw = read(r["shared_gate"], f"{name}.{n['shared_gate']}") if "shared_gate" in n else None
                    if moe.fp8:  # e4m3 with its scales as stored; a part stored unquantized is quantized
                        parts = [shared_part(r[("shared", j)], f"{name}.{n['shared'][j]}") for j in range(3)]
                        moe.load_shared_fp8(*(q for q, _ in parts), *(s for _, s in parts), gate_weight=gw)
                    else:
                        moe.load_shared(*(read(r[("shared", j)], f"{name}.{n['shared'][j]}") for j in range(3)),
                                        gate_weight=gw)
                if b["layout"] == "fused":
                    for j, e, cnt in _runs(moe.local):  # only this rank's rows of the [E, ...] tensors
                        _store_experts(moe, j, expert_part(moe, r["gate_up"], e, e + cnt),
                                       expert_part(moe, r["down"], e, e + cnt))
                else:
                    for j, e in enumerate(moe.local):
                        g, u, dn = (expert_part(moe, b["experts"][(e, p)]) for p in range(3))
                        _store_experts(moe, j, _cat_parts(g, u), dn)
    model.tie_weights()
    _finish(model, dev, path)
    if (path / "generation_config.json").is_file() and model.can_generate():
        model.generation_config = transformers.GenerationConfig.from_pretrained(path)
    return model.eval()


def _expert_as(moe: WeaveMoE, t: torch.Tensor, s: torch.Tensor | None) -> tuple:
    """A checkpoint's expert tensor t [..., N, K] (with its block scales s, or None) in moe's format: (e4m3, fp32
    scales) for an FP8 block, (bf16, None) for a bf16 one."""
    from ..fp8 import quantize_weight

    dev = moe.router_weight.device
    t = t.to(dev)
    if moe.fp8:
        return (t, s.to(device=dev, dtype=torch.float32)) if s is not None else quantize_weight(t)
    return (dequant_fp8_weight(t, s.to(dev)) if s is not None else t), None


def _cat_parts(g: tuple, u: tuple) -> tuple:
    """One expert's gate and up parts (_expert_as) -> its w13 rows [2I, H] (and scales [2I/128, H/128]: FP8 blocks
    have I % 128 == 0, so gate and up never share a scale block)."""
    return torch.cat([g[0], u[0]]), (torch.cat([g[1], u[1]]) if g[1] is not None else None)


@torch.no_grad()
def _store_experts(moe: WeaveMoE, j: int, w13: tuple, w2: tuple) -> None:
    """Local experts j, j + 1, ... of moe from (w13 [c, 2I, H] or [2I, H], scales) and (w2, scales) (_expert_as)."""
    c = w13[0].shape[0] if w13[0].dim() == 3 else 1
    if moe.fp8:
        for dst, src in ((moe.w13_q, w13[0]), (moe.w13_s, w13[1]), (moe.w2_q, w2[0]), (moe.w2_s, w2[1])):
            dst[j:j + c].copy_(src.reshape(dst[j:j + c].shape))
    else:
        moe.w13[j:j + c].copy_(w13[0].reshape(moe.w13[j:j + c].shape))
        moe.w2[j:j + c].copy_(w2[0].reshape(moe.w2[j:j + c].shape))


def _finish(model, dev: torch.device, path: Path) -> None:
    """What from_pretrained does after loading: the non-persistent buffers (rotary inv_freq, ...) computed by the
    model's initialize_weights, which skips what was loaded; then no tensor may be left on the meta device."""
    def left(only_persistent: bool) -> list:
        skip = {n for n, _ in model.named_non_persistent_buffers()} if only_persistent else set()
        return [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta and n not in skip]

    missing = left(only_persistent=True)
    if missing:  # _plan found every tensor in the checkpoint: this would be a gap in load_model itself
        raise CheckpointError(f"load_model: {', '.join(missing[:5])} not loaded from {path}")
    for name, buf in list(model.named_non_persistent_buffers()):
        path_, _, attr = name.rpartition(".")
        (model.get_submodule(path_) if path_ else model)._buffers[attr] = torch.empty_like(buf, device=dev)
    for mod in model.modules():
        if isinstance(mod, WeaveMoE):  # loaded; not a module transformers knows how to initialise
            mod._is_hf_initialized = True
    model.initialize_weights()
    missing = left(only_persistent=False)
    if missing:
        raise CheckpointError(f"load_model: {', '.join(missing[:5])} left uninitialised")
