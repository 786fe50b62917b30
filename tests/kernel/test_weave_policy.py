"""The `weave` policy without a GPU: parsing, the cost-table / choice plumbing into Params, the mirrors of
csrc/params.h, and csrc/choice.cuh (the in-kernel parallel choice) built as host C++ against cost_model.cuh and
weave_sim.costmodel.choose."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from weave_kernel import buffers as buf  # noqa: E402
from weave_kernel import megakernel as mk  # noqa: E402
from weave_kernel.choice import choice_agrees, counts_from_routing, geometry_model, model_choice  # noqa: E402
from weave_kernel.policies import POLICY_STATIC, POLICY_WEAVE, parse_policy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "weave_kernel" / "csrc"
PARAMS_H = (CSRC / "params.h").read_text()
CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def test_parse_weave_policies():
    p = parse_policy("weave", 132)
    assert (p.name, p.policy_id, p.num_comm_ctas, p.needs_cost_table) == ("weave", POLICY_WEAVE, 0, True)
    p = parse_policy("weave:20", 132)
    assert (p.name, p.policy_id, p.num_comm_ctas) == ("weave:20", POLICY_WEAVE, 20)
    assert parse_policy("weave:131", 132).num_comm_ctas == 131
    assert not parse_policy("static:8", 132).needs_cost_table
    for bad in ("weave:0", "weave:132", "weave:x", "weave:", "weave:-3", "weaves", "static:"):
        with pytest.raises(ValueError):
            parse_policy(bad, 132)
    with pytest.raises(ValueError, match="at least 2 CTAs"):
        parse_policy("weave", 1)
    with pytest.raises(ValueError, match="weave, weave:C"):
        parse_policy("dynamic", 132)


def test_parse_weave_without_stealing():
    p = parse_policy("weave-nosteal", 132)
    assert (p.name, p.policy_id, p.num_comm_ctas, p.steal, p.needs_cost_table) == \
        ("weave-nosteal", POLICY_WEAVE, 0, False, True)
    assert parse_policy("weave", 132).steal and parse_policy("weave:8", 132).steal
    assert parse_policy("static:8", 132).steal  # unused outside weave; the kernel reads it only under weave
    with pytest.raises(ValueError, match="static:C"):
        parse_policy("weave-nosteal:8", 132)
    with pytest.raises(ValueError, match="at least 2 CTAs"):
        parse_policy("weave-nosteal", 1)


def test_params_h_mirrors():
    assert int(re.search(r"kPolicyWeave = (\d+)", PARAMS_H).group(1)) == POLICY_WEAVE
    slots = dict(re.findall(r"(kChoice\w+) = (\d+)", PARAMS_H))
    assert int(slots.pop("kChoiceLen")) == buf.CHOICE_LEN
    order = ["kChoiceCommSms", "kChoiceChunks", "kChoiceTimeNs", "kChoiceUsedComm", "kChoiceEpoch"]
    assert [int(slots[k]) for k in order] == list(range(len(mk.CHOICE_SLOTS)))
    cm = (CSRC / "cost_model.cuh").read_text()
    assert f"kLen == {buf.COST_TABLE_LEN}" in cm
    assert f"kVersion = {mk.COST_TABLE_VERSION};" in cm


def test_build_cost_table_is_weave_sims_table():
    from weave_sim.costtable import TABLE_LEN, table_for
    from weave_sim.profile import load_profile

    t = mk.build_cost_table("h200")
    assert t.dtype == np.float64 and t.shape == (TABLE_LEN,) == (buf.COST_TABLE_LEN,)
    np.testing.assert_array_equal(t, table_for(load_profile("h200")).data)
    prof = load_profile("h100-sxm")
    np.testing.assert_array_equal(mk.build_cost_table(prof), table_for(prof).data)
    with pytest.raises(Exception, match="no hardware profile"):
        mk.build_cost_table("no-such-gpu")


def _fake_layer(world=2, rank=0):
    """A MoEMegakernel with CPU tensors (no extension, no GPU): enough for _params."""
    layer = object.__new__(mk.MoEMegakernel)
    i32 = dict(dtype=torch.int32)
    layer.plan = buf.plan_buffers(256, 8, 2, world, 64)
    for name in ("expert_owner", "owner_experts", "peer_base", "expert_ctr", "pair_slot", "sorted_pair", "g0_done",
                 "sched", "grid_bar", "err", "timeline", "timeline_count", "g0s_done"):
        setattr(layer, name, torch.zeros(8, **i32))
    layer.hs, layer.ys = torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    layer.shared_inter, layer.max_shared_blocks = 0, 1
    layer.epoch_ctr = torch.zeros(1, dtype=torch.int64)
    layer.h = torch.zeros(8, dtype=torch.bfloat16)
    layer.cost_table = torch.as_tensor(mk.build_cost_table())
    layer.choice = torch.full((buf.CHOICE_LEN,), -1.0, dtype=torch.float64)
    layer.rank, layer.world, layer.top_k, layer.hidden, layer.inter = rank, world, 2, 256, 128
    layer.num_experts, layer.num_local_experts, layer.max_tokens = 8, 8 // world, 64
    layer.num_ctas, layer.timeline_per_cta, layer.epoch, layer.timeout_ns = 132, 0, 3, 10**9
    layer.cooperative, layer.dispatch = True, "threads"
    return layer


def test_params_carry_the_cost_table_and_choice_buffer():
    layer = _fake_layer()
    x = torch.zeros(10, 256, dtype=torch.bfloat16)
    ids = torch.zeros(10, 2, dtype=torch.int32)
    tw = torch.zeros(10, 2)
    y = torch.zeros(10, 256, dtype=torch.bfloat16)
    for spec, used, steal in (("weave", 0, 1), ("weave:24", 24, 1), ("static:8", 8, 1), ("weave-nosteal", 0, 0)):
        pol = parse_policy(spec, layer.num_ctas)
        d = layer._params(x, ids, tw, x, x, y, pol, False)
        assert d["cost_table"] == layer.cost_table.data_ptr() != 0
        assert d["choice"] == layer.choice.data_ptr() != 0
        assert (d["policy"], d["num_comm_ctas"], d["steal"]) == (pol.policy_id, used, steal)
        assert d["epoch_ctr"] == layer.epoch_ctr.data_ptr() != 0
    # every key the binding's launch() reads is supplied, and nothing else but the host's call count "epoch",
    # which kernels before the device epoch counter read (bench --ab-csrc against such sources)
    binding = (CSRC / "binding.cpp").read_text()
    start = binding.index("weave::Params read_params(const py::dict& d")
    launch_body = binding[start:binding.index("\n}\n", start)]
    keys = set(re.findall(r'(?:get<[\w:]+>|ptr<[\w:\s]+>)\(d, "(\w+)"\)', launch_body))
    assert keys == set(d) - {"epoch"}, keys ^ (set(d) - {"epoch"})
    assert d["epoch"] == layer.epoch
    assert parse_policy("static:8", 132).policy_id == POLICY_STATIC


def test_launcher_gets_the_calls_values_in_the_order_its_signature_names_them():
    """MoEMegakernel._launch passes a call's own values to the extension's Launcher.launch positionally; each must be
    what the full dict (_params) gives under the parameter's name in binding.cpp's signature, the Launcher is built
    from that dict once, and again when a buffer or option it read changes."""
    binding = (CSRC / "binding.cpp").read_text()
    sig = re.search(r"void launch\(uint64_t x,(.*?)\) \{", binding, re.S).group(0)
    names = re.findall(r"(?:uint64_t|int32_t) (\w+)", sig)
    assert names[0] == "x" and names[-1] == "stream" and len(names) == 22
    built, calls = [], []

    class _Launcher:
        def __init__(self, params):
            built.append(params)

        def launch(self, *args):
            calls.append(args)

    layer = _fake_layer()
    layer.ext = type("Ext", (), {"Launcher": _Launcher, "fp8_experts": 2})()
    layer.symm, layer.device = torch.zeros(8, dtype=torch.uint8), torch.device("cpu")
    layer.shared_inter, layer._launcher, layer._launcher_key = 128, None, None
    x = torch.zeros(10, 256, dtype=torch.bfloat16)
    ids, tw, y = torch.zeros(10, 2, dtype=torch.int32), torch.zeros(10, 2), torch.zeros(10, 256, dtype=torch.bfloat16)
    w13, w2 = torch.zeros(4, 256, 256, dtype=torch.bfloat16), torch.zeros(4, 256, 128, dtype=torch.bfloat16)
    sw = (torch.zeros(256, 256, dtype=torch.bfloat16), torch.zeros(256, 128, dtype=torch.bfloat16))
    scale = torch.zeros(10)
    cases = [("weave", False, None, "last", None), ("static:8", True, sw, "first", scale),
             ("weave-nosteal", False, sw, "last", None)]
    mk_stream = mk._current_raw_stream
    mk._current_raw_stream = lambda device: 12345
    try:
        for spec, tl, shared, order, sc in cases:
            pol = parse_policy(spec, layer.num_ctas)
            layer._launch(x, ids, tw, w13, w2, y, pol, tl, shared, order, sc)
            want = layer._params(x, ids, tw, w13, w2, y, pol, tl, shared, order, sc)
            got = dict(zip(names, calls[-1]))
            assert got.pop("stream") == 12345
            assert got == {k: want[k] for k in got}, spec
        assert len(built) == 1  # one Launcher for all three calls
        layer.dispatch = "bulk"  # an option the dict reads: a new Launcher
        layer._launch(x, ids, tw, w13, w2, y, parse_policy("weave", 132), False)
        assert len(built) == 2 and built[-1]["dispatch_bulk"] == mk.dispatch_issuers("bulk")
    finally:
        mk._current_raw_stream = mk_stream


def test_a_launch_that_fails_does_not_use_up_an_epoch():
    """The kernel clears the counters of the next epoch's parity (expert_ctr, g0_done); an epoch without a kernel
    would leave the one after it dirty counters, so a launch that raises must not advance the epoch."""
    layer = _fake_layer()
    layer.broken, layer.device = None, torch.device("cpu")

    class _Ext:
        calls = 0

        def launch(self, params, stream):
            _Ext.calls += 1
            raise ValueError("weave launch: rejected")

    layer.ext = _Ext()
    x = torch.zeros(10, 256, dtype=torch.bfloat16)
    ids = torch.zeros(10, 2, dtype=torch.int32)
    el = layer.num_local_experts
    w13, w2 = torch.zeros(el, 256, 256, dtype=torch.bfloat16), torch.zeros(el, 256, 128, dtype=torch.bfloat16)
    before = layer.epoch
    with pytest.raises(Exception):  # without CUDA the stream lookup raises first; with it, the launch does
        layer(x, ids, torch.full((10, 2), 0.5), w13, w2, policy="static:8", check=False)
    assert layer.epoch == before
    with pytest.raises(ValueError, match="w13 must have shape"):  # rejected before the epoch advances, too
        layer(x, ids, torch.full((10, 2), 0.5), w2, w2, policy="static:8", check=False)
    assert layer.epoch == before


def test_last_choice_reads_the_slots():
    """The slots belong to the last call if their epoch is the device counter's (CUDA-graph replays advance
    the counter without the host knowing; the host's own call count does not decide)."""
    layer = _fake_layer()
    layer.epoch_ctr.fill_(5)
    layer.choice[:5] = torch.tensor([12.0, 4.0, 1234.5, 12.0, 5.0], dtype=torch.float64)
    assert layer.last_choice() == {"c_star": 12, "k_star": 4, "time_ns": 1234.5, "comm_ctas_used": 12, "epoch": 5}
    layer.epoch_ctr.fill_(6)  # a later non-weave call (or graph replay) leaves the slots of epoch 5
    assert layer.last_choice() is None
    layer.epoch_ctr.zero_()  # no call yet
    layer.choice[4] = 0.0
    assert layer.last_choice() is None


def test_counts_from_routing_are_pair_based():
    from weave_sim.placement import contiguous, round_robin

    rng = np.random.default_rng(0)
    for pl in (contiguous(16, 2), round_robin(16, 4)):
        ids = [rng.integers(0, 16, size=(n, 3)) for n in (50, 7, 0, 31)[: pl.num_gpus]]
        c = counts_from_routing(ids, 16, pl)
        pairs, rows = np.array(c["source_expert_pairs"]), np.array(c["dispatch_rows"])
        assert c["dispatch_rows_kind"] == "pairs" and c["tokens_per_gpu"] == [len(i) for i in ids]
        assert pairs.sum(axis=1).tolist() == [3 * len(i) for i in ids]
        assert (rows.sum(axis=1) == pairs.sum(axis=1)).all()
        owner = np.asarray(pl.owner)
        for s in range(pl.num_gpus):
            for d in range(pl.num_gpus):
                assert rows[s, d] == sum(int((owner[i] == d)) for i in ids[s].ravel())


@pytest.fixture(scope="module")
def choice_host(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("choice") / "choice_host"
    subprocess.run([CXX, "-std=c++17", "-O2", "-I", str(CSRC), "-I", str(ROOT / "tests" / "border"),
                    str(ROOT / "tests" / "kernel" / "choice_host.cpp"), "-o", str(out)], check=True)
    return out


def _skewed(rng, n, e, k, s):
    p = 1.0 / np.arange(1, e + 1) ** s
    p = p[rng.permutation(e)]
    p /= p.sum()
    return np.stack([rng.choice(e, size=k, replace=False, p=p) for _ in range(n)]) if n else np.zeros((0, k), int)


def test_parallel_choice_matches_serial_header_and_python(choice_host):
    """choice.cuh's volumes and argmin, split over 1/7/32/256 'threads', equal cost_model.cuh's serial ones
    bit for bit, and the choice equals weave_sim.costmodel.choose with pair-based dispatch rows."""
    from weave_sim.placement import contiguous, round_robin
    from weave_sim.presets import get_model

    table = mk.build_cost_table()
    rng = np.random.default_rng(1)
    cases = []
    for name, g, tokens, skew in (("qwen3-30b-a3b", 2, (4096, 3000), 1.0), ("deepseek-v3", 2, (2048, 2048), 1.2),
                                  ("phi-3.5-moe", 2, (8192, 100), 0.5), ("deepseek-v2-lite", 4, (512, 1, 0, 77), 1.0),
                                  ("qwen3.5-35b-a3b", 8, (64,) * 8, 2.0), ("mixtral-8x7b", 1, (300,), 1.0)):
        m = get_model(name)
        for pl in (contiguous(m.num_experts, g), round_robin(m.num_experts, g)):
            ids = [_skewed(rng, n, m.num_experts, m.top_k, skew) for n in tokens]
            cases.append((m, pl, counts_from_routing(ids, m.num_experts, pl)))
    lines = [" ".join(repr(float(x)) for x in table), str(len(cases))]
    for m, pl, c in cases:
        lines.append(f"{pl.num_gpus} {m.num_experts} {m.hidden_size} {m.expert_ffn_size}")
        lines.append(" ".join(map(str, pl.owner)))
        lines.append(" ".join(str(v) for row in c["source_expert_pairs"] for v in row))
    out = subprocess.run([str(choice_host)], input="\n".join(lines), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    it = iter(out)
    n = 0
    for m, pl, c in cases:
        py = model_choice(c, m, pl)
        for g in range(pl.num_gpus):
            cs, ks, t, vol_ok, choice_ok = next(it).split()
            assert vol_ok == "1" and choice_ok == "1", (m.name, g)
            kern = {"c_star": int(cs), "k_star": int(ks), "time_ns": float(t)}
            assert choice_agrees(kern, py[g], rel_time=1e-12), (m.name, g, kern, py[g])
            n += 1
    assert n == sum(pl.num_gpus for _, pl, _ in cases)


def test_geometry_model():
    m = geometry_model(2048, 768, 32, 8)
    assert (m.hidden_size, m.expert_ffn_size, m.num_experts, m.top_k, m.num_shared_experts) == (2048, 768, 32, 8, 0)


def test_bench_weave_nosteal_flag():
    from weave_kernel.bench import parse_args

    assert parse_args(["--weave-nosteal"]).weave_nosteal and not parse_args([]).weave_nosteal
    with pytest.raises(SystemExit):
        parse_args(["--weave-nosteal", "--no-weave"])
