"""The interchange format: round trip, files written by others, and every bad input rejected by name."""
import json

import numpy as np
import pytest
from hypothesis import given, strategies as st

from weave_sim.presets import PRESETS, get_model
from weave_sim.traces import (DEFAULT_TRACE, RoutingTrace, TraceError, default_trace, generate, load_trace,
                              save_trace)

SMALL_MODELS = ["gpt-oss-20b", "mixtral-8x7b", "phi-3.5-moe", "olmoe-1b-7b", "deepseek-v2-lite"]


def _ids_for(model: str, num_tokens: int, seed: int = 0) -> np.ndarray:
    preset = get_model(model)
    return generate("uniform", num_experts=preset.num_experts, top_k=preset.top_k,
                    num_layers=preset.num_moe_layers, num_tokens=num_tokens, seed=seed).topk_ids


def _write(path, **arrays):
    """An npz written the way a stranger would: plain np.savez, any dtypes."""
    np.savez(path, **arrays)
    return path


def _valid_arrays(model="gpt-oss-20b", num_tokens=6):
    ids = _ids_for(model, num_tokens)
    return {"topk_ids": ids, "topk_probs": np.full(ids.shape, 0.25, np.float32),
            "request_id": np.array([0, 0, 0, 1, 1, 1]), "position": np.array([5, 6, 7, 0, 1, 2]),
            "metadata": json.dumps({"model": model, "source": "test", "license": "CC0"})}


@given(model=st.sampled_from(SMALL_MODELS), num_tokens=st.integers(1, 40), with_probs=st.booleans(),
       with_requests=st.booleans(), seed=st.integers(0, 2**16))
def test_round_trip(tmp_path_factory, model, num_tokens, with_probs, with_requests, seed):
    ids = _ids_for(model, num_tokens, seed)
    rng = np.random.default_rng(seed)
    probs = rng.random(ids.shape).astype(np.float32) if with_probs else None
    request_id = np.sort(rng.integers(0, 5, num_tokens)) if with_requests else None
    position = np.arange(num_tokens) if with_requests else None
    trace = RoutingTrace(ids, probs, request_id, position, {"model": model, "source": "hypothesis"})
    path = save_trace(tmp_path_factory.mktemp("rt") / "trace.npz", trace)
    back = load_trace(path)
    assert back.topk_ids.dtype == np.int64 and np.array_equal(back.topk_ids, ids)
    assert back.model == model and back.metadata["source"] == "hypothesis"
    assert (back.num_tokens, back.num_layers, back.top_k) == ids.shape
    if with_probs:
        assert back.topk_probs.dtype == np.float32 and np.array_equal(back.topk_probs, probs)
    else:
        assert back.topk_probs is None
    for name, value in (("request_id", request_id), ("position", position)):
        got = getattr(back, name)
        assert (got is None) if value is None else (got.dtype == np.int64 and np.array_equal(got, value))


def test_file_written_by_someone_else_loads(tmp_path):
    """int16 ids, float64 probs, int32 request ids, bytes metadata and unknown keys: all fine."""
    arrays = _valid_arrays()
    path = _write(tmp_path / "theirs.npz", topk_ids=arrays["topk_ids"].astype(np.int16),
                  topk_probs=arrays["topk_probs"].astype(np.float64),
                  request_id=arrays["request_id"].astype(np.int32), position=arrays["position"].astype(np.uint16),
                  metadata=np.array(json.dumps({"model": "gpt-oss-20b", "notes": "mine"}).encode()),
                  requests=np.array("not part of the format"), hidden_states=np.zeros((6, 3)))
    trace = load_trace(path)
    assert trace.model == "gpt-oss-20b" and trace.metadata["notes"] == "mine"
    assert trace.topk_ids.dtype == np.int64 and np.array_equal(trace.topk_ids, arrays["topk_ids"])
    assert trace.request_id.tolist() == [0, 0, 0, 1, 1, 1]


def test_model_from_argument_metadata_or_hf_id(tmp_path):
    ids = _ids_for("mixtral-8x7b", 3)
    bare = _write(tmp_path / "bare.npz", topk_ids=ids)
    assert load_trace(bare, model="mixtral-8x7b").model == "mixtral-8x7b"
    hf = _write(tmp_path / "hf.npz", topk_ids=ids, metadata=json.dumps({"model": "mistralai/Mixtral-8x7B-v0.1"}))
    assert load_trace(hf).model == "mixtral-8x7b"
    assert load_trace(hf, model="mixtral-8x7b").model == "mixtral-8x7b"


def _bad_cases(tmp_path):
    """(name, path, model, words the message must contain)."""
    good = _valid_arrays()
    ids = good["topk_ids"]
    cases = []

    def case(name, words, model=None, raw=None, **overrides):
        path = tmp_path / f"{name}.npz"
        if raw is not None:
            path.write_bytes(raw)
        else:
            arrays = {k: v for k, v in {**good, **overrides}.items() if v is not None}
            np.savez(path, **arrays)
        cases.append((name, path, model, words))

    case("empty_file", ["empty"], raw=b"")
    case("not_npz", ["not in numpy's npz or .npy format"], raw=b"this is a text file, not a zip archive\n")
    case("broken_zip", ["not a readable npz"], raw=b"PK\x03\x04 a zip header and nothing of a zip after it\n")
    case("missing_ids", ["missing", "topk_ids"], topk_ids=None)
    case("rank2", ["rank 3"], topk_ids=ids[:, :, 0])
    case("float_ids", ["integer"], topk_ids=ids.astype(np.float32))
    case("no_tokens", ["empty trace"], topk_ids=ids[:0], topk_probs=None, request_id=None, position=None)
    neg = ids.copy(); neg[2, 5, 1] = -1
    case("negative_id", ["expert id -1", "out of range"], topk_ids=neg)
    big = ids.copy(); big[4, 0, 0] = 32
    case("id_too_large", ["expert id 32", "out of range"], topk_ids=big)
    dup = ids.copy(); dup[1, 3, 1] = dup[1, 3, 0]
    case("duplicate", ["duplicate expert", "token 1", "layer 3"], topk_ids=dup)
    case("wrong_top_k", ["top_k 3", "top_k 4"], topk_ids=ids[:, :, :3], topk_probs=None)
    case("wrong_layers", ["layer count 23", "24"], topk_ids=ids[:, :23], topk_probs=None)
    case("probs_shape", ["topk_probs shape"], topk_probs=good["topk_probs"][:, :, :2])
    nan = good["topk_probs"].copy(); nan[0, 0, 0] = np.nan
    case("probs_nan", ["NaN"], topk_probs=nan)
    negp = good["topk_probs"].copy(); negp[3, 1, 2] = -0.1
    case("probs_negative", ["negative"], topk_probs=negp)
    case("request_len", ["request_id", "one per token"], request_id=np.zeros(5, np.int64))
    case("position_len", ["position", "one per token"], position=np.zeros(7, np.int64))
    case("request_float", ["request_id", "integer"], request_id=np.zeros(6))
    case("meta_not_json", ["not valid JSON"], metadata="{model: gpt-oss-20b")
    case("meta_not_object", ["JSON object"], metadata=json.dumps(["gpt-oss-20b"]))
    case("unknown_model", ["unknown model", "gpt-9"], metadata=json.dumps({"model": "gpt-9"}))
    case("model_mismatch", ["model mismatch", "mixtral-8x7b"], model="mixtral-8x7b")
    case("no_model", ["no model"], metadata=None)
    case("wrong_model_geometry", ["top_k 4", "top_k 2"], metadata=json.dumps({}), model="mixtral-8x7b")
    return cases


def test_every_bad_input_is_rejected_by_name(tmp_path):
    cases = _bad_cases(tmp_path)
    for name, path, model, words in cases:
        with pytest.raises(TraceError) as info:
            load_trace(path, model=model)
        message = str(info.value)
        for word in words:
            assert word in message, f"{name}: {word!r} not in {message!r}"
        assert isinstance(info.value, ValueError)


def test_missing_file_npy_and_directory(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.npz")
    np.save(tmp_path / "ids.npy", _ids_for("gpt-oss-20b", 2))
    with pytest.raises(TraceError, match="npy array, not an npz"):
        load_trace(tmp_path / "ids.npy", model="gpt-oss-20b")
    with pytest.raises(TraceError, match="directory"):
        load_trace(tmp_path)


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, topk_ids=np.array([[[0, 1, 2, 3]] * 24], dtype=object), metadata='{"model": "gpt-oss-20b"}')
    with pytest.raises(TraceError, match="not a readable npz"):
        load_trace(path)


def test_save_refuses_a_trace_its_model_would_reject(tmp_path):
    ids = _ids_for("gpt-oss-20b", 4)
    ids[0, 0, 1] = ids[0, 0, 0]
    with pytest.raises(TraceError, match="duplicate"):
        save_trace(tmp_path / "bad.npz", RoutingTrace(ids, metadata={"model": "gpt-oss-20b"}))
    assert not (tmp_path / "bad.npz").exists()


def test_save_keeps_odd_suffix_and_is_compact(tmp_path):
    trace = RoutingTrace(_ids_for("deepseek-v2-lite", 50), metadata={"model": "deepseek-v2-lite"})
    path = save_trace(tmp_path / "trace.routing", trace)
    assert path.exists() and not (tmp_path / "trace.routing.npz").exists()
    with np.load(path) as data:
        assert data["topk_ids"].dtype == np.int8
    assert np.array_equal(load_trace(path).topk_ids, trace.topk_ids)


def test_shipped_subset_is_valid_and_documented():
    assert DEFAULT_TRACE.stat().st_size < 4e6
    trace = default_trace()
    meta = trace.metadata
    assert trace.model == "gpt-oss-20b" and meta["license"] == "Apache-2.0"
    assert "AmanPriyanshu/GPT-OSS-MoE-ExpertFingerprinting@72b368f" in meta["source"]
    assert 8000 <= trace.num_tokens <= 16384 and trace.topk_probs is not None
    # Complete requests only: each request's positions are consecutive.
    for rid in np.unique(trace.request_id):
        pos = trace.position[trace.request_id == rid]
        assert np.all(np.diff(pos) == 1)
    assert len(meta["requests"]) == np.unique(trace.request_id).size
    assert (get_model("gpt-oss-20b").num_moe_layers, 4) == trace.topk_ids.shape[1:]
    assert "gpt-oss-20b" in PRESETS
