"""Where the host's time per eager layer call goes (one GPU): the Python checks, the parameter dict, the
extension's launch from the whole dict (dict parsing, TMA descriptors, the launch itself) against the Launcher the
layer calls (the call's own values only), and the whole call, each timed over many calls without a sync (the GPU
runs behind). Usage: torchrun --nproc_per_node=1 tests/kernel/host_cost.py [--expert-dtype fp8]"""
from __future__ import annotations

import argparse

import torch

from weave_kernel import validate
from weave_kernel.bench_timing import host_us_per_call
from weave_kernel.megakernel import MoEMegakernel, _current_raw_stream
from weave_kernel.policies import parse_policy
from weave_kernel.reference import make_weights
from weave_kernel.routing import skewed_routing
from weave_kernel.symm import init_ranks
from weave_kernel.validate import check_layer_inputs
from weave_sim.placement import contiguous
from weave_sim.presets import get_model


class _DictOnly:
    """The extension without its Launcher: a layer on it launches from the whole dict every call."""

    def __init__(self, ext):
        self._ext = ext

    def __getattr__(self, name):
        if name == "Launcher":
            raise AttributeError(name)
        return getattr(self._ext, name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--expert-dtype", choices=("bf16", "fp8"), default="bf16")
    fp8 = ap.parse_args().expert_dtype == "fp8"
    init_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    m = get_model("qwen3-30b-a3b")
    E, k, H, I, n = m.num_experts, m.top_k, m.hidden_size, m.expert_ffn_size, 128
    kw = dict(hidden=H, inter=I, num_experts=E, top_k=k, placement=contiguous(E, 1), max_tokens=n,
              expert_dtype="fp8" if fp8 else "bf16")
    layer = MoEMegakernel(**kw)
    w13, w2 = make_weights(E, H, I, device=dev, generator=torch.Generator(device=dev).manual_seed(0))
    if fp8:
        from weave_kernel.fp8 import quantize_experts

        w13, w2 = quantize_experts(w13, w2)
    ids, w = skewed_routing(n, E, k, seed=0, zipf_s=1.2)
    x = torch.randn(n, H, device=dev).to(torch.bfloat16)
    ids, w = torch.as_tensor(ids, device=dev), torch.as_tensor(w, device=dev)
    y = torch.empty(n, H, dtype=torch.bfloat16, device=dev)
    pol = parse_policy("weave", layer.num_ctas)
    stream = torch.cuda.current_stream(dev).cuda_stream
    params = layer._params(x, ids, w, w13, w2, y, pol, False)
    layer(x, ids, w, w13, w2, policy="weave", out=y)  # warm
    dict_layer = MoEMegakernel(**kw, ext=_DictOnly(layer.ext))
    dict_layer(x, ids, w, w13, w2, policy="weave", out=y)
    rows = {
        "check_layer_inputs": lambda: check_layer_inputs(
            x, ids, w, w13, w2, hidden=H, inter=I, num_experts=E, num_local_experts=E, top_k=k, max_tokens=n,
            device=dev, check_ids=False, fp8=fp8),
        "  its fast predicate alone": lambda: validate._inputs_fine(x, ids, w, w13, w2, H, I, E, k, n, dev, fp8),
        "parse_policy": lambda: parse_policy("weave", layer.num_ctas),
        "_params dict": lambda: layer._params(x, ids, w, w13, w2, y, pol, False),
        "current_stream": lambda: torch.cuda.current_stream(dev).cuda_stream,
        "raw stream (the layer's)": lambda: _current_raw_stream(dev),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "ext.launch (same dict)": lambda: (setattr(layer, "epoch", layer.epoch + 1), layer.ext.launch(params, stream)),
        "layer._launch (Launcher)": lambda: (setattr(layer, "epoch", layer.epoch + 1),
                                             layer._launch(x, ids, w, w13, w2, y, pol, False)),
        "whole call, check=False": lambda: layer(x, ids, w, w13, w2, policy="weave", check=False, out=y),
        "the same, dict path": lambda: dict_layer(x, ids, w, w13, w2, policy="weave", check=False, out=y),
    }
    print(f"qwen3-30b-a3b, {n} tokens, {'fp8' if fp8 else 'bf16'} experts")
    for name, fn in rows.items():
        print(f"{name:<30} {host_us_per_call(fn, 50 if 'call' in name or 'launch' in name else 500):8.1f} us")
    layer.raise_if_error()
    dict_layer.raise_if_error()


if __name__ == "__main__":
    main()
