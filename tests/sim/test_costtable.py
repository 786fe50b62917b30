import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weave_sim import costtable as ct
from weave_sim.profile import load_profile


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


@pytest.mark.parametrize("chunks", [(), (0,), tuple(range(1, 10))])
def test_bad_chunk_sets(chunks):
    with pytest.raises(ValueError, match="chunk"):
        ct.build_table(load_profile(), chunks)


def test_unknown_chunk_count_rejected():
    with pytest.raises(ValueError, match="K=3"):
        ct.build_table(load_profile(), (1, 3))
