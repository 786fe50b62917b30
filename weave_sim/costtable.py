"""The cost model as a flat table of float64: the one form that crosses into the CUDA kernel.

Python's cost model (costmodel.py) and the kernel's (weave_kernel/csrc/cost_model.cuh) both evaluate
T(c, K) from this table and nothing else, so they make the same choice for the same counts. The layout
below is mirrored by `weave::cost_table` in the header; tests/sim/test_costtable.py checks the two agree
and that a host build of the header picks the same (c*, K*) as Python.

Layout (offsets in float64 slots):
    [OFF_HEADER, +HEADER_LEN)  version, num_sms, nvlink_peak_gbs, gemm_peak_tflops, hbm_gbs, rho,
                               tile_rows, tile_cols, num_chunk_choices, max_comm_sms, (reserved ...)
    [OFF_BW, +MAX_SMS+1)       push GB/s for c = 0..MAX_SMS comm CTAs
    [OFF_TFLOPS, +NUM_ROW_BUCKETS) per-SM TFLOP/s at 2^b rows per expert (costmodel.per_sm_tflops: linear in between)
    [OFF_CHUNKS, +MAX_CHUNK_CHOICES) candidate K values (0 = unused slot)
    [OFF_EFF, +MAX_CHUNK_CHOICES) eff(K) for those K
"""
from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from .profile import HardwareProfile

TABLE_VERSION = 3  # 2: max_comm_sms, the end of the choice's grid; 3: per-SM rate linear between buckets
HEADER_FIELDS = (
    "version", "num_sms", "nvlink_peak_gbs", "gemm_peak_tflops", "hbm_gbs", "rho",
    "tile_rows", "tile_cols", "num_chunk_choices", "max_comm_sms",
)
# The choice considers c in [1, max_comm_sms], max_comm_sms = min(num_sms - 1, MAX_COMM_SMS): the range the
# calibration measures the push curve over (1..64 comm CTAs). In the megakernel the CTAs at and above it never
# dispatch, so they skip the choice and start their tiles at once (docs/kernel.md, "The choice off the critical
# path").
MAX_COMM_SMS = 64
HEADER_LEN = 16
MAX_SMS = 256
NUM_ROW_BUCKETS = 16
MAX_CHUNK_CHOICES = 8
OFF_HEADER = 0
OFF_BW = OFF_HEADER + HEADER_LEN
OFF_TFLOPS = OFF_BW + MAX_SMS + 1
OFF_CHUNKS = OFF_TFLOPS + NUM_ROW_BUCKETS
OFF_EFF = OFF_CHUNKS + MAX_CHUNK_CHOICES
TABLE_LEN = OFF_EFF + MAX_CHUNK_CHOICES
DEFAULT_CHUNKS = (1, 2, 4, 8)


def row_bucket(rows) -> np.ndarray:
    """Bucket of an integer rows-per-expert count: floor(log2(max(rows, 1))), capped at the last bucket."""
    r = np.maximum(np.asarray(rows, dtype=np.int64), 1)
    b = np.zeros(r.shape, dtype=np.int64)
    for shift in range(1, NUM_ROW_BUCKETS):  # exact integer log2, the same as the kernel's
        b += (r >> shift) > 0
    return b


@dataclass(frozen=True, eq=False)
class CostTable:
    """A typed view over the flat table (`data`, float64 [TABLE_LEN])."""

    data: np.ndarray

    def header(self, name: str) -> float:
        return float(self.data[OFF_HEADER + HEADER_FIELDS.index(name)])

    @property
    def num_sms(self) -> int:
        return int(self.header("num_sms"))

    @property
    def max_comm_sms(self) -> int:
        return int(self.header("max_comm_sms"))

    @property
    def bw_gbs(self) -> np.ndarray:
        return self.data[OFF_BW:OFF_BW + MAX_SMS + 1]

    @property
    def per_sm_tflops(self) -> np.ndarray:
        return self.data[OFF_TFLOPS:OFF_TFLOPS + NUM_ROW_BUCKETS]

    @property
    def chunks(self) -> tuple[int, ...]:
        n = int(self.header("num_chunk_choices"))
        return tuple(int(k) for k in self.data[OFF_CHUNKS:OFF_CHUNKS + n])

    @property
    def eff(self) -> np.ndarray:
        return self.data[OFF_EFF:OFF_EFF + len(self.chunks)]

    def to_dict(self) -> dict:
        return {"layout_version": TABLE_VERSION, "table": self.data.tolist()}


def build_table(profile: HardwareProfile, chunks=DEFAULT_CHUNKS) -> CostTable:
    """Sample the profile's curves at the points the kernel can ask for."""
    chunks = tuple(int(k) for k in chunks)
    if not 1 <= len(chunks) <= MAX_CHUNK_CHOICES or min(chunks) < 1:
        raise ValueError(f"between 1 and {MAX_CHUNK_CHOICES} chunk counts >= 1 are needed, got {chunks}")
    if profile.num_sms > MAX_SMS:
        raise ValueError(f"profile has {profile.num_sms} SMs; the table holds at most {MAX_SMS}")
    data = np.zeros(TABLE_LEN, dtype=np.float64)
    header = {
        "version": TABLE_VERSION, "num_sms": profile.num_sms, "nvlink_peak_gbs": profile.nvlink_peak_gbs,
        "gemm_peak_tflops": profile.gemm_peak_tflops, "hbm_gbs": profile.hbm_gbs, "rho": profile.rho,
        "tile_rows": profile.tile_rows, "tile_cols": profile.tile_cols, "num_chunk_choices": len(chunks),
        "max_comm_sms": min(profile.num_sms - 1, MAX_COMM_SMS),
    }
    for i, name in enumerate(HEADER_FIELDS):
        data[OFF_HEADER + i] = header[name]
    data[OFF_BW:OFF_BW + MAX_SMS + 1] = profile.bandwidth_gbs(np.arange(MAX_SMS + 1))
    data[OFF_TFLOPS:OFF_TFLOPS + NUM_ROW_BUCKETS] = profile.per_sm_tflops(2.0 ** np.arange(NUM_ROW_BUCKETS))
    data[OFF_CHUNKS:OFF_CHUNKS + len(chunks)] = chunks
    data[OFF_EFF:OFF_EFF + len(chunks)] = [profile.efficiency(k) for k in chunks]
    return CostTable(data)


_CACHE: dict[tuple[int, tuple[int, ...]], tuple[HardwareProfile, CostTable]] = {}


def table_for(profile: HardwareProfile, chunks=DEFAULT_CHUNKS) -> CostTable:
    """build_table, memoised per profile object and chunk set (profiles are immutable)."""
    key = (id(profile), tuple(int(k) for k in chunks))
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not profile:
        hit = _CACHE[key] = (profile, build_table(profile, key[1]))
    return hit[1]
