"""Matplotlib PNGs: an SM Gantt chart coloured by task kind, and latency versus comm SM count."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .dag import C_VIRTUAL, KIND_NAMES
from .metrics import LayerResult

KIND_COLORS = {"count_exchange": "#7f7f7f", "dispatch": "#1f77b4", "gemm0": "#2ca02c", "gemm1": "#98df8a",
               "combine": "#ff7f0e", "reduce": "#9467bd"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def plot_gantt(result: LayerResult, path, *, gpus=None) -> Path:
    """One row per SM (GPUs stacked, GPU 0 on top), one bar per task coloured by kind; white = idle.

    Bars are drawn as one PolyCollection per kind, so layers with ~1e5 tasks plot in seconds.
    """
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    if not result.has_records:
        raise ValueError("this LayerResult's per-task records were dropped; re-simulate the layer to plot it")
    plt = _pyplot()
    g_ = result.graph
    G, N = result.roles.shape
    gpus = list(range(G)) if gpus is None else list(gpus)
    row_of_gpu = np.full(G, -1)
    row_of_gpu[gpus] = np.arange(len(gpus))
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.02 * N * len(gpus)))
    ran = (g_.cls != C_VIRTUAL) & (row_of_gpu[g_.gpu] >= 0)
    handles = []
    for k, name in enumerate(KIND_NAMES[:-1]):
        m = ran & (g_.kind == k)
        if not m.any():
            continue
        x0, x1 = result.start_ns[m] / 1e3, result.end_ns[m] / 1e3
        y0 = row_of_gpu[g_.gpu[m]] * (N + 4) + result.sm[m] - 0.5
        verts = np.stack([np.c_[x0, y0], np.c_[x1, y0], np.c_[x1, y0 + 1], np.c_[x0, y0 + 1]], axis=1)
        ax.add_collection(PolyCollection(verts, facecolors=KIND_COLORS[name], edgecolors="none"))
        handles.append(Patch(color=KIND_COLORS[name], label=name))
    ax.set_xlim(0, max(result.latency_ns / 1e3, 1e-3))
    ax.set_ylim(len(gpus) * (N + 4), -2)
    ax.set_yticks([i * (N + 4) + N / 2 for i in range(len(gpus))], [f"GPU {g}" for g in gpus])
    ax.set_xlabel("time (us)")
    ax.set_title(f"{result.policy}: layer {result.layer}, latency {result.latency_ns / 1e3:.1f} us")
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=6)
    return _save(fig, path)


def latency_vs_c(workload, profile, *, grid=None, seed: int = 0, **options) -> dict:
    """Simulated latency (us) of static:c and of Weave's scheduling at one uniform (c, best K), per c."""
    from .run import simulate_layer

    grid = [c for c in (grid or (2, 4, 8, 12, 16, 20, 24, 32, 48, 64, 96)) if c < profile.num_sms]
    static_us, best_k_us = [], []
    for c in grid:
        k1 = simulate_layer(workload, profile, f"static:{c}", seed=seed, **options).latency_ns
        static_us.append(k1 / 1e3)
        more = [simulate_layer(workload, profile, f"static:{c}:{k}", seed=seed, **options).latency_ns
                for k in (2, 4, 8) if k in profile.chunk_eff]
        best_k_us.append(min([k1, *more]) / 1e3)
    return {"c": grid, "static_us": static_us, "static_best_k_us": best_k_us}


def plot_latency_vs_c(workload, profile, path, *, chosen: LayerResult | None = None,
                      oracle: LayerResult | None = None, grid=None, seed: int = 0, **options) -> Path:
    """Latency vs comm SM count (static:c with K=1 and with its best K), the chosen and oracle points marked;
    with an oracle result, also its search curve (Weave's scheduling at one c on all GPUs, best K).

    `chosen` and `oracle` are LayerResults (e.g. of 'weave' and 'oracle'); their x is the mean comm SM count
    over GPUs. Extra options go to simulate_layer.
    """
    plt = _pyplot()
    data = latency_vs_c(workload, profile, grid=grid, seed=seed, **options)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(data["c"], data["static_us"], "o-", label="static:c (K=1)")
    ax.plot(data["c"], data["static_best_k_us"], "s--", label="static:c, best K")
    curve = _uniform_curve(oracle)
    if curve:
        ax.plot(*zip(*curve), "^-", color="C2", alpha=0.7, label="weave scheduling at one c (best K; oracle's search)")
    for res, marker, color in ((chosen, "*", "C3"), (oracle, "D", "k")):
        if res is not None:
            x = float(np.mean(res.plan.num_comm_sms))
            ax.plot([x], [res.latency_ns / 1e3], marker, color=color, markersize=12,
                    label=f"{res.policy} ({res.plan.label}, c={x:.1f})")
    ax.set_xlabel("comm SMs per GPU (c)")
    ax.set_ylabel("layer latency (us)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _uniform_curve(oracle: LayerResult | None) -> list[tuple[int, float]]:
    """(c, best latency us over K) from the oracle's 'weave[c=..,K=..]' candidates, sorted by c."""
    best: dict[int, float] = {}
    for label, ns in (oracle.candidates if oracle is not None else []):
        if label.startswith("weave[c="):
            c = int(label[len("weave[c="):].split(",")[0])
            best[c] = min(best.get(c, float("inf")), ns / 1e3)
    return sorted(best.items())


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
