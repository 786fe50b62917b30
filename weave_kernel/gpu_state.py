"""What a GPU was doing while a benchmark ran: SM clock, power draw, temperature and the reasons the driver gives
for holding the clocks back, sampled in the background by `nvidia-smi` (no Python bindings needed).

    s = GpuStateSampler.for_device(dev)
    t0 = time.time(); ...; t1 = time.time()
    print(s.summary(t0, t1))   # {'sm_mhz_min': ..., 'sm_mhz_median': ..., 'power_w_max': ..., ...}
    s.stop()

Sustained tensor work can make a GPU lower its clocks (power cap, temperature); a long benchmark sweep then
times its last configurations on a slower chip than its first. The summary of each configuration's window says
whether that happened. Where nvidia-smi is missing or refuses the query, the sampler records nothing and
`summary` returns None: the benchmark runs the same, without this record.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

# clocks_event_reasons bits (nvidia-smi --help-query-gpu); older drivers call the field clocks_throttle_reasons
EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")


def decode_reasons(mask: int) -> list[str]:
    """Names of the bits set in a clocks-event-reasons mask (unknown bits as hex)."""
    names = [name for bit, name in EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(EVENT_REASONS)
    return names + ([hex(rest)] if rest else [])


def parse_sample(line: str) -> dict | None:
    """One `--format=csv,noheader,nounits` line of FIELDS + a reasons field; None if it does not parse (e.g.
    '[N/A]' or an error message)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS) + 1:
        return None
    try:
        return {"sm_mhz": float(parts[0]), "power_w": float(parts[1]), "temp_c": float(parts[2]),
                "reasons": int(parts[3], 16)}
    except ValueError:
        return None


def summarize(samples: list[tuple[float, dict]], t0: float, t1: float) -> dict | None:
    """Summary of the samples taken in [t0, t1] (host seconds); with none inside, the one nearest the window."""
    if not samples:
        return None
    inside = [s for t, s in samples if t0 <= t <= t1]
    if not inside:
        mid = 0.5 * (t0 + t1)
        inside = [min(samples, key=lambda ts: abs(ts[0] - mid))[1]]
    mask = 0
    for s in inside:
        mask |= s["reasons"]
    clocks = [s["sm_mhz"] for s in inside]
    return {"samples": len(inside), "sm_mhz_min": min(clocks), "sm_mhz_median": statistics.median(clocks),
            "power_w_max": max(s["power_w"] for s in inside),
            "power_w_median": statistics.median(s["power_w"] for s in inside),
            "temp_c_max": max(s["temp_c"] for s in inside),
            "event_reasons": decode_reasons(mask & ~0x1)}  # gpu_idle: between calls, not a slowdown


def power_limit_w(ident: str) -> float | None:
    """The board power limit nvidia-smi reports for GPU `ident` (None where it does not answer)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(ident), "--query-gpu=power.limit", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def sustained_ms(fn, seconds: float, idle_s: float = 1.5, calls: int | None = None) -> tuple[float, float, float]:
    """fn() back to back for `seconds` after `idle_s` of idling (clocks and power recover); the second half
    timed with CUDA events. Returns (ms per call, host start, host end of the timed half) so that a sampler's
    summary of that window gives the clock and power the GPU settled at. calls: run exactly this many calls
    instead (timing the last half): what collective calls need, where every rank must issue the same number
    (sustained_calls gives one)."""
    import torch

    torch.cuda.synchronize()
    time.sleep(idle_s)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if calls is not None:
        calls = max(int(calls), 2)
        for _ in range(calls - calls // 2):
            fn()
        torch.cuda.synchronize()
        t0 = time.time()
        a.record()
        for _ in range(calls // 2):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / (calls // 2), t0, time.time()
    end = time.time() + seconds
    timed, n, t0 = False, 0, 0.0
    while time.time() < end:
        if not timed and time.time() > end - seconds / 2:
            torch.cuda.synchronize()
            a.record()
            timed, t0 = True, time.time()
        for _ in range(4):
            fn()
            n += timed
        torch.cuda.synchronize()  # keeps the host loop in step with the GPU (a few us per 4 calls)
    if not timed:  # calls longer than half the window: time one round
        a.record()
        t0 = time.time()
        for _ in range(4):
            fn()
        n = 4
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / max(n, 1), t0, time.time()


def sustained_calls(fn, seconds: float, agree=lambda n: n) -> int:
    """How many back-to-back calls of fn() fill about `seconds` (from the median of 3 timed calls);
    agree: combines the ranks' counts (e.g. an all-reduce MAX) so that every rank issues the same number."""
    import torch

    from .symm import cuda_time_ms

    ms = cuda_time_ms(fn, 1, 3)
    torch.cuda.synchronize()
    return int(agree(max(4, int(seconds * 1e3 / max(ms, 1e-3)))))


class GpuStateSampler:
    """Background `nvidia-smi --query-gpu ... -lms period_ms` for one GPU (`ident`: index, UUID or PCI id)."""

    def __init__(self, ident: str, period_ms: int = 100):
        self.ident, self.period_ms = str(ident), int(period_ms)
        self.samples: list[tuple[float, dict]] = []
        self.reason_field: str | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def _query(self, reason_field: str, loop: bool) -> list[str]:
        cmd = ["nvidia-smi", "-i", self.ident, f"--query-gpu={','.join(FIELDS + (reason_field,))}",
               "--format=csv,noheader,nounits"]
        return cmd + [f"-lms={self.period_ms}"] if loop else cmd

    @classmethod
    def for_device(cls, dev, period_ms: int = 100) -> GpuStateSampler:
        """A started sampler of torch device `dev`: by its UUID, else (nvidia-smi did not take it) its index.
        Records nothing where nvidia-smi does not answer (reason_field None)."""
        import torch

        s = cls(f"GPU-{torch.cuda.get_device_properties(dev).uuid}", period_ms).start()
        return s if s.reason_field is not None else cls(str(torch.device(dev).index or 0), period_ms).start()

    def start(self) -> GpuStateSampler:
        """Start sampling (once: a started sampler is returned as it is)."""
        if self._proc is not None or shutil.which("nvidia-smi") is None:
            return self
        for field in REASON_FIELDS:  # the first field name this driver accepts
            try:
                out = subprocess.run(self._query(field, False), capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                return self
            if out.returncode == 0 and parse_sample(out.stdout.strip().splitlines()[0] if out.stdout else ""):
                self.reason_field = field
                break
        if self.reason_field is None:
            return self
        self._proc = subprocess.Popen(self._query(self.reason_field, True), stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            s = parse_sample(line)
            if s is not None:
                self.samples.append((time.time(), s))

    def summary(self, t0: float, t1: float) -> dict | None:
        """summarize() of this GPU's samples in [t0, t1], with the GPU it sampled (`gpu`: the ident, a UUID
        where one was given: each device call may land on another board, and boards differ in power)."""
        out = summarize(list(self.samples), t0, t1)
        return None if out is None else {**out, "gpu": self.ident}

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None
