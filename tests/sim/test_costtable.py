import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weave_sim import costtable as ct
from weave_sim.profile import load_profile, profile_from_dict


@given(st.integers(-5, 2**20))
def test_row_bucket_is_floor_log2(rows):
    expected = min(max(rows, 1).bit_length() - 1, ct.NUM_ROW_BUCKETS - 1)
    assert int(ct.row_bucket(rows)) == expected


def test_table_samples_the_profile():
    p = load_profile()
    t = ct.build_table(p, (1, 2, 4))
    assert t.data.shape == (ct.TABLE_LEN,) and t.num_sms == p.num_sms
    assert t.chunks == (1, 2, 4) and t.eff.tolist() == [p.efficiency(k) for k in (1, 2, 4)]
    assert np.allclose(t.bw_gbs[:133], p.bandwidth_gbs(np.arange(133)))
    assert t.per_sm_tflops[7] == pytest.approx(p.per_sm_tflops(128))
    assert t.header("rho") == p.rho and t.to_dict()["layout_version"] == ct.TABLE_VERSION
    assert ct.table_for(p, (1, 2, 4)) is ct.table_for(p, (1, 2, 4))


def test_the_choice_grid_ends_at_max_comm_sms():
    """The kernel's CTAs at and above max_comm_sms skip the choice, so no choice may go past it."""
    from weave_sim import costmodel as cm
    from weave_sim.placement import contiguous
    from weave_sim.presets import ModelPreset
    from weave_sim.workload import layer_workload

    p = load_profile("h200")
    t = ct.table_for(p)
    assert t.max_comm_sms == min(p.num_sms - 1, ct.MAX_COMM_SMS) == 64
    data = p.to_dict()
    data["num_sms"] = 16
    assert ct.table_for(profile_from_dict(data)).max_comm_sms == 15
    # a layer that is almost all traffic (every token goes to the other GPU, tiny experts): over the whole
    # range the model would push with 98-123 SMs; the choice stops at max_comm_sms
    model = ModelPreset("m", 7168, 128, 8, 2, 0, 1)
    ids = np.concatenate([np.tile([[4, 5]], (4096, 1)), np.tile([[0, 1]], (4096, 1))])
    vol = cm.Volumes.from_workloads([layer_workload(ids, model, contiguous(8, 2))], p)
    assert cm.choose(vol, p).num_comm_sms.tolist() == [[64, 64]]
    assert cm.choose(vol, p, comm_sms=np.arange(1, p.num_sms)).num_comm_sms.min() > 64


@pytest.mark.parametrize("chunks", [(), (0,), tuple(range(1, 10))])
def test_bad_chunk_sets(chunks):
    with pytest.raises(ValueError, match="chunk"):
        ct.build_table(load_profile(), chunks)


def test_unknown_chunk_count_rejected():
    with pytest.raises(ValueError, match="K=3"):
        ct.build_table(load_profile(), (1, 3))
