"""Hardware profiles: versioned JSON data describing one GPU kind and its links.

A profile holds calibrated curves, not formulas: NVLink push bandwidth versus communication CTA count,
per-SM GEMM rate versus rows per expert, chunk efficiency versus chunk count, the combine overlap ratio,
and fixed costs. `weave-sim calibrate` (see the calibration issue) writes new ones; the shipped ones are
seeded from shared measurements and say so in `source`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .jsonfile import read_json

SCHEMA_VERSION = 1
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
_TOP_KEYS = {
    "schema_version", "name", "gpu", "num_sms", "version", "source", "measured_by",
    "nvlink", "gemm", "hbm_gbs", "chunk_eff", "rho", "fixed_ns", "calibration", "power",
}
_FIXED_KEYS = {"launch", "host_sync", "grid_barrier", "task_claim", "signal", "count_exchange", "decision"}
# optional: "dispatch_piece", the megakernel's cost per dispatch piece (fence + flag; engine/dag.py), else `signal`
_OPTIONAL_FIXED_KEYS = {"dispatch_piece"}
_POWER_KEYS = {"cap_w", "base_w", "w_per_tflops", "exponent"}
# The most a fixed cost may be: 1000 s, far above any hardware's and far below what int64 nanoseconds hold.
MAX_FIXED_NS = 1e12


@dataclass(frozen=True)
class PowerModel:
    """The board's power cap and the power GEMM work and HBM traffic draw, for the SM clock a sustained layer
    can hold.

    With the SMs at clock f (a fraction of the clock the profile's GEMM rates hold at, f <= 1) computing R
    TFLOP/s while moving B TB/s through HBM: P = base_w + w_per_tflops * R * f ** exponent + w_per_tbs * B
    (the energy per FLOP falls with the clock, as the voltage does; HBM's does not). Where P exceeds cap_w the
    chip lowers the clock until it does not (the H200: sw_power_cap at 700 W). Fitted to sustained runs of the
    kernel's own tiles at several CTA counts and a sustained HBM copy (power block of
    `python -m weave_kernel.calibrate`; docs/power.md)."""

    cap_w: float
    base_w: float
    w_per_tflops: float
    exponent: float
    w_per_tbs: float = 0.0
    min_clock: float = 0.3  # never predict below this fraction (outside anything measured)
    # the energy of an MMA on padding rows (zeros in A) relative to one on routed rows; the engine weights the padding
    # FLOPs by it (engine.run.gemm_power_tflops). 1 = the same (the shipped profiles)
    pad_energy: float = 1.0

    def watts(self, tflops, clock, tbs=0.0) -> np.ndarray:
        """Board power computing `tflops` and moving `tbs` TB/s through HBM (both achieved) at clock fraction
        `clock`."""
        return (self.base_w + self.w_per_tflops * np.asarray(tflops) * np.asarray(clock) ** self.exponent
                + self.w_per_tbs * np.asarray(tbs))

    def clock(self, tflops, clock, tbs=0.0) -> np.ndarray:
        """The clock fraction the cap allows for work that achieved `tflops` and `tbs` at clock fraction
        `clock`, both rates taken to scale with the clock (array-friendly; bisection)."""
        f0 = np.asarray(clock, dtype=np.float64)
        r1 = np.maximum(np.asarray(tflops, dtype=np.float64), 0.0) / f0
        b1 = np.maximum(np.asarray(tbs, dtype=np.float64), 0.0) / f0
        r1, b1 = np.broadcast_arrays(r1, b1)

        def over(f):
            return self.watts(r1 * f, f, b1 * f) - self.cap_w

        lo, hi = np.full(r1.shape, self.min_clock), np.ones(r1.shape)
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            high = over(mid) > 0
            hi = np.where(high, mid, hi)
            lo = np.where(high, lo, mid)
        f = np.where(over(np.ones(r1.shape)) <= 0, 1.0, np.where(over(lo) > 0, self.min_clock, lo))
        return f if f.ndim else float(f)


class ProfileError(ValueError):
    """A hardware profile is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU kind. Curves are (x, y) tables; lookups interpolate and clamp at the ends."""

    name: str
    gpu: str
    num_sms: int
    version: str
    source: str
    bw_ctas: np.ndarray  # comm CTA counts, ascending
    bw_gbs: np.ndarray  # push GB/s at those counts, non-decreasing
    nvlink_peak_gbs: float
    gemm_rows: np.ndarray  # rows per expert, ascending
    gemm_per_sm_tflops: np.ndarray
    gemm_peak_tflops: float
    tile_rows: int
    tile_cols: int
    hbm_gbs: float
    chunk_eff: dict[int, float]
    rho: float
    fixed_ns: dict[str, int]
    power: PowerModel | None = None
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    # Optional: per-SM GEMM rate factor when n SMs of the GPU run GEMM tiles at once (gemm.scale_by_ctas),
    # relative to per_sm_tflops_by_rows; None = the rate does not depend on n.
    gemm_scale_ctas: np.ndarray | None = None
    gemm_scale: np.ndarray | None = None
    # Optional (gemm.k_fixed): the share of a calibration tile's time that does not grow with the tile's K (claim,
    # pipeline fill, epilogue), and the K the GEMM curve was measured at; share 0 = time proportional to FLOPs.
    gemm_k_fixed_share: float = 0.0
    gemm_k_cal: float = 0.0
    # Optional (gemm.half_tile_cost): what a half tile (a block of at most tile_rows / 2 rows that skips the MMAs of
    # its padding rows: the kernel layout "expert-packed-half") costs, as a fraction of a whole tile. 0.5 = its MMAs
    # only; more where it still streams a whole tile's weight stages (calibrate --amend P --half-tiles BENCH fits it).
    # FP8 tiles may have their own (gemm.fp8_half_tile_cost, which fp8_profile puts here; default: this one).
    gemm_half_tile_cost: float = 0.5

    # --- curves -------------------------------------------------------------------------------
    def bandwidth_gbs(self, num_comm_ctas) -> np.ndarray:
        """NVLink push GB/s achieved by `num_comm_ctas` CTAs (array-friendly); 0 for 0 CTAs."""
        c = np.asarray(num_comm_ctas, dtype=np.float64)
        bw = np.interp(c, np.concatenate([[0.0], self.bw_ctas]), np.concatenate([[0.0], self.bw_gbs]))
        return np.minimum(bw, self.nvlink_peak_gbs)

    def per_sm_tflops(self, rows_per_expert) -> np.ndarray:
        """bf16 TFLOP/s of one SM on expert GEMM tiles when experts get `rows_per_expert` rows."""
        r = np.maximum(np.asarray(rows_per_expert, dtype=np.float64), 1.0)
        return np.interp(np.log2(r), np.log2(self.gemm_rows), self.gemm_per_sm_tflops)

    def concurrency_scale(self, num_gemm_sms) -> np.ndarray:
        """Factor on the per-SM GEMM rate while `num_gemm_sms` SMs of one GPU run GEMM tiles at once (they
        share L2, HBM and the power budget); 1 where the profile has no gemm.scale_by_ctas."""
        n = np.asarray(num_gemm_sms, dtype=np.float64)
        if self.gemm_scale is None:
            return np.ones_like(n) if n.ndim else 1.0
        return np.interp(n, self.gemm_scale_ctas, self.gemm_scale)

    def k_factor(self, k_dim: float) -> float:
        """Factor on a GEMM tile's FLOPs / rate time when its reduction length is k_dim: the calibrated tile
        (K = gemm_k_cal) takes t = fixed + m K with fixed = share * t, so a tile of K takes
        t (share K_cal / K + 1 - share) per FLOP-time of the calibrated rate. 1 without gemm.k_fixed."""
        if self.gemm_k_fixed_share <= 0.0 or k_dim <= 0:
            return 1.0
        f = self.gemm_k_fixed_share
        return f * self.gemm_k_cal / float(k_dim) + 1.0 - f

    def tflops(self, num_compute_sms, rows_per_expert) -> np.ndarray:
        """GEMM TFLOP/s of `num_compute_sms` SMs, never above the chip's peak."""
        n = np.asarray(num_compute_sms, dtype=np.float64)
        return np.minimum(n * self.per_sm_tflops(rows_per_expert) * self.concurrency_scale(n),
                          self.gemm_peak_tflops)

    def efficiency(self, num_chunks: int) -> float:
        """Chunk efficiency eff(K) <= 1; K must be one of the calibrated chunk counts (a table, no interpolation:
        a profile may calibrate only some K, and the policies that pick K pick among those; the cost model's
        default set, costtable.DEFAULT_CHUNKS, needs every one of its K)."""
        try:
            return self.chunk_eff[int(num_chunks)]
        except KeyError:
            raise ProfileError(
                f"profile {self.name}: no chunk efficiency for K={num_chunks} in its chunk_eff (it gives K = "
                f"{', '.join(map(str, sorted(self.chunk_eff)))}); the cost model needs eff(K) for every K it may "
                f"choose: add chunk_eff[\"{num_chunks}\"] to the profile (weave-sim calibrate measures it)"
            ) from None

    def to_dict(self) -> dict:
        return dict(self.raw)


def load_profile(name_or_path: str | Path = "h200") -> HardwareProfile:
    """Load a shipped profile by name ('h200', 'h100-sxm') or any profile JSON by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
        raise ProfileError(f"no hardware profile {str(name_or_path)!r}; shipped profiles: {known}")
    return profile_from_dict(read_json(path, "hardware profile", ProfileError), origin=str(path))


def profile_from_dict(data: dict, origin: str = "<dict>") -> HardwareProfile:
    """Validate a profile dictionary and build a HardwareProfile; unknown keys are errors."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ProfileError(f"{origin}: {msg}")

    def get(obj: dict, key: str, label: str):
        need(key in obj, f"missing key {label!r}")
        return obj[key]

    def num(value, label: str, *, lo: float = 0.0, lo_ok: bool = False, hi: float | None = None) -> float:
        """A finite number > lo (>= lo with lo_ok) and <= hi, else a ProfileError naming the field and the value."""
        x = _float(value)
        bound = f"{'>=' if lo_ok else '>'} {lo:g}" + ("" if hi is None else f" and <= {hi:g}")
        need(x is not None and (x >= lo if lo_ok else x > lo) and (hi is None or x <= hi),
             f"{label} must be a finite number {bound}, got {value!r}")
        return x

    def count(value, label: str, lo: int = 1) -> int:
        """An integer >= lo (an integral float such as 128.0 too)."""
        x = _float(value)
        need(x is not None and x == int(x) and x >= lo, f"{label} must be an integer >= {lo}, got {value!r}")
        return int(x)

    need(isinstance(data, dict), "profile must be a JSON object")
    unknown = set(data) - _TOP_KEYS
    need(not unknown, f"unknown keys {sorted(unknown)}")
    need(data.get("schema_version") == SCHEMA_VERSION, f"schema_version must be {SCHEMA_VERSION}")
    for key in ("name", "gpu", "num_sms", "nvlink", "gemm", "hbm_gbs", "chunk_eff", "rho", "fixed_ns"):
        need(key in data, f"missing key {key!r}")
    nv, gm = data["nvlink"], data["gemm"]
    for key, obj in (("nvlink", nv), ("gemm", gm), ("chunk_eff", data["chunk_eff"]), ("fixed_ns", data["fixed_ns"])):
        need(isinstance(obj, dict), f"{key} must be a JSON object, got {type(obj).__name__} {obj!r:.60}")
    ctas, gbs = _table(get(nv, "push_gbs_by_ctas", "nvlink.push_gbs_by_ctas"), "nvlink.push_gbs_by_ctas", need)
    need(np.all(np.diff(gbs) >= 0), "nvlink.push_gbs_by_ctas must be non-decreasing")
    # (0 CTAs push nothing, implicitly: bandwidth_gbs; every count the table names must move data)
    need(gbs[0] > 0, f"nvlink.push_gbs_by_ctas: GB/s must be > 0 at every CTA count, got {gbs[0]:g} at "
                     f"{ctas[0]:g} CTAs")
    rows, rate = _table(get(gm, "per_sm_tflops_by_rows", "gemm.per_sm_tflops_by_rows"), "gemm.per_sm_tflops_by_rows",
                        need)
    need(np.all(np.diff(rate) >= 0), "gemm.per_sm_tflops_by_rows must be non-decreasing")
    need(rate[0] > 0, f"gemm.per_sm_tflops_by_rows: TFLOP/s must be > 0 at every row count, got {rate[0]:g} at "
                      f"{rows[0]:g} rows per expert")
    peak_tflops = num(get(gm, "peak_tflops", "gemm.peak_tflops"), "gemm.peak_tflops")
    nv_peak = num(nv["peak_gbs"], "nvlink.peak_gbs") if "peak_gbs" in nv else float(gbs.max())
    tile_rows = count(gm.get("tile_rows", 128), "gemm.tile_rows")
    tile_cols = count(gm.get("tile_cols", 128), "gemm.tile_cols")
    for key in ("fp8_scale", "fp8_fixed_scale"):  # (applied by fp8_profile)
        if key in gm:
            num(gm[key], f"gemm.{key}")
    scale_ctas = scale = None
    if "scale_by_ctas" in gm:
        scale_ctas, scale = _table(gm["scale_by_ctas"], "gemm.scale_by_ctas", need)
        need(np.all(scale > 0), "gemm.scale_by_ctas: factors must be > 0")
    k_share = k_cal = 0.0
    if "k_fixed" in gm:
        kf = gm["k_fixed"]
        need(isinstance(kf, dict) and {"share", "k"} <= set(kf), "gemm.k_fixed needs 'share' and 'k'")
        k_share, k_cal = _float(kf["share"]), _float(kf["k"])
        need(k_share is not None and k_cal is not None and 0.0 <= k_share < 1.0 and k_cal > 0,
             f"gemm.k_fixed: share must lie in [0, 1) and k be > 0, got share {kf['share']!r} and k {kf['k']!r}")
    for key in ("half_tile_cost", "fp8_half_tile_cost"):  # (the FP8 one is applied by fp8_profile)
        v = gm.get(key, 0.5)
        need(isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 < v <= 1.0,
             f"gemm.{key} must be a number in (0, 1]")
    half_cost = float(gm.get("half_tile_cost", 0.5))
    hbm_gbs = num(data["hbm_gbs"], "hbm_gbs")
    eff = {}
    for k, v in data["chunk_eff"].items():
        eff[count(k, "chunk_eff: a chunk count K")] = num(v, f"chunk_eff[{k!r}]", hi=1.0)
    need(1 in eff, f"chunk_eff needs K=1, got K = {sorted(eff)}")
    rho = num(data["rho"], "rho", lo_ok=True, hi=1.0)
    fixed = {k: int(num(v, f"fixed_ns.{k}", lo_ok=True, hi=MAX_FIXED_NS)) for k, v in data["fixed_ns"].items()}
    need(_FIXED_KEYS <= set(fixed) <= _FIXED_KEYS | _OPTIONAL_FIXED_KEYS,
         f"fixed_ns must have exactly {sorted(_FIXED_KEYS)}, and may have {sorted(_OPTIONAL_FIXED_KEYS)}")
    num_sms = count(data["num_sms"], "num_sms", lo=2)
    power = None
    if "power" in data:
        pw = data["power"]
        need(isinstance(pw, dict) and _POWER_KEYS <= set(pw), f"power needs {sorted(_POWER_KEYS)}")
        vals = {k: num(pw[k], f"power.{k}", lo_ok=True) for k in sorted(_POWER_KEYS)}
        vals["w_per_tbs"] = num(pw.get("w_per_tbs", 0.0), "power.w_per_tbs", lo_ok=True)
        vals["pad_energy"] = num(pw.get("pad_energy", 1.0), "power.pad_energy", lo_ok=True, hi=1.0)
        need(vals["cap_w"] > vals["base_w"] >= 0, "power: cap_w must exceed base_w >= 0")
        need(vals["w_per_tflops"] > 0 and vals["exponent"] >= 0, "power: w_per_tflops > 0 and exponent >= 0")
        power = PowerModel(**vals)
    return HardwareProfile(
        name=str(data["name"]), gpu=str(data["gpu"]), num_sms=num_sms,
        version=str(data.get("version", "")), source=str(data.get("source", "")),
        bw_ctas=ctas, bw_gbs=gbs, nvlink_peak_gbs=nv_peak,
        gemm_rows=rows, gemm_per_sm_tflops=rate, gemm_peak_tflops=peak_tflops,
        tile_rows=tile_rows, tile_cols=tile_cols,
        hbm_gbs=hbm_gbs, chunk_eff=eff, rho=rho, fixed_ns=fixed, power=power,
        raw=data, gemm_scale_ctas=scale_ctas, gemm_scale=scale, gemm_k_fixed_share=k_share, gemm_k_cal=k_cal,
        gemm_half_tile_cost=half_cost,
    )


def _float(value) -> float | None:
    """`value` (a number, or a string of one: JSON keys) as a finite float; None where it is none (NaN, infinity,
    a bool, a list, ...)."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


def _table(obj, label: str, need) -> tuple[np.ndarray, np.ndarray]:
    need(isinstance(obj, dict) and len(obj) >= 2, f"{label} must map at least two x values to y values")
    pairs = []
    for k, v in obj.items():
        x, y = _float(k), _float(v)
        need(x is not None and y is not None and x > 0 and y >= 0,
             f"{label}: x must be > 0 and y >= 0, finite numbers, got {k!r}: {v!r}")
        pairs.append((x, y))
    pairs.sort()
    xs, ys = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    need(np.all(np.diff(xs) > 0), f"{label}: an x value appears twice")
    return xs, ys


# The FP8 experts' GEMM tiles inside the megakernel run about this many times the bf16 tiles' per-SM rate: the factor
# that fits the FP8 layers measured at EP=1 on one H200 (2026-12-02: weave's predicted within 5.1% median, 15.8% worst;
# tests/kernel/fp8_sim_check.py, docs/kernel.md "FP8 experts in the layer"). A profile may carry its own as
# gemm.fp8_scale.
FP8_TILE_SCALE = 1.25


def fp8_profile(profile: HardwareProfile, speedup: float | None = None,
                fixed_speedup: float | None = None) -> HardwareProfile:
    """`profile` for FP8 expert tiles: per-SM GEMM rates x speedup (default: the profile's gemm.fp8_scale, else
    FP8_TILE_SCALE), the chip's GEMM peak doubled (FP8's dense peak), and with a power model the energy per FLOP /
    speedup (the same power at the faster rate). A tile's fixed cost (gemm.k_fixed: claim, pipeline fill, epilogue)
    gets fixed_speedup instead (default: the profile's gemm.fp8_fixed_scale, else the same speedup): with the fixed
    part at 1, only the part of a tile that grows with K runs faster, so FP8 gains more on long-K tiles (docs/kernel.md,
    "The FP8 tile factor, measured in one harness")."""
    raw = json.loads(json.dumps(profile.raw))
    gemm = raw["gemm"]
    if "fp8_applied" in gemm:
        raise ValueError(f"profile {profile.name} already has FP8 tiles (x{gemm['fp8_applied']['scale']})")
    s = float(speedup if speedup is not None else gemm.get("fp8_scale", FP8_TILE_SCALE))
    sf = float(fixed_speedup if fixed_speedup is not None else gemm.get("fp8_fixed_scale", s))
    if not s > 0 or not sf > 0:
        raise ValueError(f"the FP8 tile speedups must be > 0, got {s} (tile) and {sf} (its fixed cost)")
    # the bf16 values, for table_profile (restored as they were, not divided back)
    gemm["fp8_applied"] = {"scale": s, "fixed_scale": sf, "per_sm_tflops_by_rows": dict(gemm["per_sm_tflops_by_rows"]),
                           "peak_tflops": gemm["peak_tflops"], "k_fixed": gemm.get("k_fixed"),
                           "half_tile_cost": gemm.get("half_tile_cost"),
                           "w_per_tflops": raw["power"]["w_per_tflops"] if raw.get("power") else None}
    gemm["per_sm_tflops_by_rows"] = {k: v * s for k, v in gemm["per_sm_tflops_by_rows"].items()}
    if "fp8_half_tile_cost" in gemm:  # an FP8 half tile's own share of a whole FP8 tile (calibrate --half-tiles)
        gemm["half_tile_cost"] = gemm["fp8_half_tile_cost"]
    gemm["peak_tflops"] = 2.0 * gemm["peak_tflops"]
    if gemm.get("k_fixed") and sf != s:
        # A tile of K takes F / rate x (share k / K + 1 - share) (HardwareProfile.k_factor). With the rate x s, the
        # fixed term share k / K stays at 1 / sf of its bf16 time when k grows by s / sf; the share is unchanged.
        gemm["k_fixed"] = {**gemm["k_fixed"], "k": gemm["k_fixed"]["k"] * s / sf}
    if raw.get("power"):
        raw["power"]["w_per_tflops"] = raw["power"]["w_per_tflops"] / s
    fixed = "" if sf == s else f", their fixed cost x{sf:g}"
    return profile_from_dict(raw, origin=f"{profile.name}, FP8 tiles x{s:g}{fixed}")


def table_profile(profile: HardwareProfile) -> HardwareProfile:
    """The profile whose cost table the megakernel's weave choice reads: `profile` itself, or for a profile with FP8
    tiles (fp8_profile) the bf16 one it came from. The kernel's FP8 layers read the bf16 table (docs/kernel.md, "FP8
    experts in the layer"), so the simulated choice of an FP8 layer is made with the bf16 rates, as the kernel's."""
    if "fp8_applied" not in profile.raw["gemm"]:
        return profile
    raw = json.loads(json.dumps(profile.raw))
    gemm = raw["gemm"]
    base = gemm.pop("fp8_applied")
    gemm["per_sm_tflops_by_rows"] = base["per_sm_tflops_by_rows"]
    gemm["peak_tflops"] = base["peak_tflops"]
    if base.get("k_fixed"):  # None for a profile without one (nothing was changed)
        gemm["k_fixed"] = base["k_fixed"]
    if "half_tile_cost" in base:  # (profiles made by fp8_profile before it recorded this have none)
        if base["half_tile_cost"] is None:
            gemm.pop("half_tile_cost", None)
        else:
            gemm["half_tile_cost"] = base["half_tile_cost"]
    if raw.get("power"):
        raw["power"]["w_per_tflops"] = base["w_per_tflops"]
    return profile_from_dict(raw, origin=f"{profile.name} (its bf16 tiles)")

