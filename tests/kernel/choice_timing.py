"""How long the weave policy's in-kernel choice takes by itself (one GPU, no torch needed at run time).

Builds tests/kernel/choice_timing.cu with nvcc against the kernel's own csrc/choice.cuh and runs it on five
routings (the cost table of the kernel's default profile; random top-k routing per rank): 132 CTAs of 384
threads, each with the table and the counts in shared memory as in the megakernel, time with %globaltimer
(median over the CTAs, after two warm-up repetitions): the whole choice (volumes, argmin over the c x K grid,
reductions), the argmin alone, and one evaluation of the model per thread.

    python tests/kernel/choice_timing.py [--csrc OTHER/csrc]   # another version's choice.cuh (e.g. an A/B)
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CASES = (("qwen3-30b-a3b", 1, 4096), ("qwen3-30b-a3b", 2, 4096), ("deepseek-v3", 2, 4096), ("phi-3.5-moe", 2, 4096),
         ("qwen3.5-35b-a3b", 8, 2048))


def stdin_text() -> str:
    from weave_kernel.choice import counts_from_routing
    from weave_kernel.megakernel import build_cost_table
    from weave_sim.placement import contiguous
    from weave_sim.presets import get_model

    rng = np.random.default_rng(1)
    lines = [" ".join(repr(float(x)) for x in build_cost_table()), str(len(CASES))]
    for name, g, n in CASES:
        m = get_model(name)
        pl = contiguous(m.num_experts, g)
        ids = [np.stack([rng.choice(m.num_experts, size=m.top_k, replace=False) for _ in range(n)]) for _ in range(g)]
        c = counts_from_routing(ids, m.num_experts, pl)
        lines += [f"{g} {m.num_experts} {m.hidden_size} {m.expert_ffn_size}", " ".join(map(str, pl.owner)),
                  " ".join(str(v) for row in c["source_expert_pairs"] for v in row)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csrc", default=str(ROOT / "weave_kernel" / "csrc"), help="folder with choice.cuh")
    args = ap.parse_args(argv)
    csrc = Path(args.csrc)
    if not (csrc / "choice.cuh").is_file():
        ap.error(f"no choice.cuh in {csrc}")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("needs nvcc and a Hopper GPU")
        return 2
    exe = Path(tempfile.mkdtemp()) / "choice_timing"
    subprocess.run([nvcc, "-std=c++17", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
                    "-I", str(csrc), "-I", str(ROOT / "tests" / "border"),
                    str(ROOT / "tests" / "kernel" / "choice_timing.cu"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], input=stdin_text(), capture_output=True, text=True)
    print(out.stdout, end="")
    if out.returncode:
        print(out.stderr, end="")
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
