"""CPU tests of the PyTorch references (CI runs these on CPU torch)."""
from __future__ import annotations

import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from weave_kernel.reference import ep_moe_reference, grouped_ffn, make_weights, moe_reference  # noqa: E402
from weave_kernel.routing import single_expert_routing, skewed_routing  # noqa: E402


def naive_moe(x, ids, w, w13, w2):
    """Token-by-token float64 loop: the definition, written independently."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    inter = w13.shape[1] // 2
    y = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            g = w13[e, :inter] @ x[t]
            u = w13[e, inter:] @ x[t]
            y[t] += float(w[t, j]) * (w2[e] @ (torch.nn.functional.silu(g) * u))
    return y


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _inputs(n=37, e=8, k=2, h=64, i=32, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    ids, w = skewed_routing(n, e, k, seed=seed)
    w13, w2 = make_weights(e, h, i, dtype=dtype, generator=g)
    x = torch.randn(n, h, generator=g).to(dtype)
    return x, torch.as_tensor(ids), torch.as_tensor(w), w13, w2


def test_dense_reference_matches_naive_loop():
    x, ids, w, w13, w2 = _inputs()
    assert rel(moe_reference(x, ids, w, w13, w2), naive_moe(x, ids, w, w13, w2)) < 1e-5


def test_dense_reference_detects_a_wrong_expert():
    x, ids, w, w13, w2 = _inputs(seed=3)
    bad = ids.clone()
    bad[0, 0] = (bad[0, 0] + 1) % 8
    if bool((bad[0, 0] == bad[0, 1])):
        bad[0, 0] = (bad[0, 0] + 1) % 8
    assert rel(moe_reference(x, bad, w, w13, w2), naive_moe(x, ids, w, w13, w2)) > 1e-4


def test_grouped_ffn_loop_path_with_empty_experts():
    g = torch.Generator().manual_seed(1)
    w13, w2 = make_weights(4, 64, 32, dtype=torch.float32, generator=g)
    counts = torch.tensor([3, 0, 5, 0])
    xs = torch.randn(8, 64, generator=g)
    out = grouped_ffn(xs, counts, w13, w2)
    le = [0, 0, 0, 2, 2, 2, 2, 2]
    for r, e in enumerate(le):
        h = w13[e] @ xs[r]
        ref = w2[e] @ (torch.nn.functional.silu(h[:32]) * h[32:])
        assert torch.allclose(out[r], ref, atol=1e-5)


@pytest.mark.parametrize("routing", ["skewed", "one_expert"])
def test_ep_reference_world_one_matches_dense(routing):
    x, ids, w, w13, w2 = _inputs(n=53, e=8, k=3, seed=5)
    if routing == "one_expert":
        ids_np, w_np = single_expert_routing(53, 3, expert=2, num_experts=8, seed=1)
        ids, w = torch.as_tensor(ids_np), torch.as_tensor(w_np)
    owner = torch.zeros(8, dtype=torch.int64)
    local = torch.arange(8)
    y = ep_moe_reference(x, ids, w, w13, w2, owner, local)
    assert rel(y, moe_reference(x, ids, w, w13, w2)) < 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ep_worker(rank: int, world: int, port: int, q) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        e, k, h, i = 8, 3, 64, 32
        x_all, ids_all, w_all, w13, w2 = _inputs(n=41 * world, e=e, k=k, h=h, i=i, seed=11)
        ids_all[:5, 0] = 7  # some skew onto the last rank
        owner = torch.arange(e) // (e // world)
        local = torch.arange(e) % (e // world)
        sl = slice(rank * 41, (rank + 1) * 41)
        mine = owner == rank
        y = ep_moe_reference(x_all[sl], ids_all[sl], w_all[sl], w13[mine], w2[mine], owner, local)
        ref = moe_reference(x_all, ids_all, w_all, w13, w2)[sl]
        q.put((rank, rel(y, ref)))
    finally:
        dist.destroy_process_group()


def test_ep_reference_two_ranks_gloo_matches_dense():
    """Real all_to_all over two CPU processes (gloo)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("gloo backend not available")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_ep_worker, args=(r, 2, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    errs = dict(q.get(timeout=5) for _ in range(2))
    assert max(errs.values()) < 1e-5, errs


def test_skewed_routing_properties():
    ids, w = skewed_routing(500, 16, 4, seed=7, zipf_s=1.2)
    assert ids.shape == (500, 4) and ids.dtype == np.int32
    assert all(len(set(r)) == 4 for r in ids.tolist())
    assert np.allclose(w.sum(1), 1, atol=1e-5)
    loads = np.bincount(ids.ravel(), minlength=16)
    assert loads.max() > 2 * loads.mean()  # skewed
    ids2, _ = skewed_routing(500, 16, 4, seed=7, zipf_s=1.2)
    assert (ids == ids2).all()
