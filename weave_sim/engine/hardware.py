"""Hardware in SimPy: NVLink as a fluid, bandwidth-shared fabric, and the SM roles.

(The SM worker process itself lives in core.py: it is the scheduler's claim loop.)

NVLink model (all rates in GB/s = bytes/ns). Each active transfer is pushed by one CTA of the source GPU.
Capacities: GPU s's egress is BW(n) when n of its CTAs push (the profile's push curve: about 20 GB/s per
CTA, plateau near 365 GB/s); GPU d's ingress is the NVLink peak; one transfer never exceeds a CTA's top
rate max_n BW(n)/n. Two ways to share them (`fairness`):
    'shares' (default): a transfer s->d with n transfers leaving s and m entering d moves at
        min(BW(n) / n, ingress_peak / m). Cheap; not work-conserving: when a hot destination's ingress
        limits some of s's transfers, s's unused egress is not handed to its other transfers.
    'maxmin': max-min fair rates by water-filling (at most 2G + 1 rounds; the 'shares' answer is used when
        it is already fair). About 1.7x slower on the benchmark layer; on the six Weave models at 4 x 4096
        tokens it changed latencies by at most 2.1% (only `weave`'s; docs/engine.md).
Rates change only when a transfer starts or ends; transfers of one (s, d) pair all move
at the same rate, so the fabric keeps one cumulative "bytes served per transfer" clock per pair and a heap
of finish targets, and holds a single pending SimPy timeout: the earliest finish (rounded up to an integer
ns). Cost per start or finish is O(G^2) numpy work, independent of the number of active transfers.
Same-time order: transfers due at one instant complete in (src, dst) row-major order, and within a pair
by (finish target, start order); their events then resume the waiting SMs in that order.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
import simpy

from ..profile import HardwareProfile

FAIRNESS = ("shares", "maxmin")  # how concurrent transfers split the links (see module docstring)
ROLE_COMM, ROLE_COMPUTE, ROLE_ANY = 0, 1, 2
ROLE_NAMES = ("comm", "compute", "any")
_DONE_BYTES = 1e-3  # a transfer within a thousandth of a byte of its target is complete (float slack)


class NVLinkFabric:
    """Per-GPU egress and ingress bandwidth shared by the active transfers (see module docstring)."""

    def __init__(self, env: simpy.Environment, num_gpus: int, profile: HardwareProfile, record: bool = False,
                 fairness: str = "shares"):
        self.env = env
        G = num_gpus
        self._profile = profile
        if fairness not in FAIRNESS:
            raise ValueError(f"fairness must be one of {FAIRNESS}, got {fairness!r}")
        self.fairness = fairness
        # One CTA's top push rate, over the whole curve (past its last point BW is flat, so BW(n)/n only falls).
        n = np.arange(1, max(profile.num_sms, int(np.ceil(profile.bw_ctas.max()))) + 1, dtype=np.float64)
        self.flow_cap_gbs = float(np.max(profile.bandwidth_gbs(n) / n))
        self._set_tables(profile.num_sms)
        self.ingress_gbs = float(profile.nvlink_peak_gbs)
        self._served = np.zeros((G, G))  # bytes served per transfer on each pair since t=0
        self._rate = np.zeros((G, G))
        self._head = np.full((G, G), np.inf)  # earliest finish target per pair
        self._heaps: list[list] = [[] for _ in range(G * G)]
        self._active = np.zeros((G, G), dtype=np.int64)
        self.delivered_bytes = np.zeros((G, G), dtype=np.int64)  # [src, dst], counted at each transfer's end
        self._n_out = np.zeros(G, dtype=np.int64)
        self._n_in = np.zeros(G, dtype=np.int64)
        self._last_ns = 0
        self._seq = 0
        self._token = 0
        self._pending_ns = -1
        self.record = record
        self.fast_paths = self.water_fills = 0  # how rates were found (equal shares were fair / water-filling)
        self.samples: list[tuple[int, np.ndarray, np.ndarray]] = []  # (t_ns, egress GB/s [G], ingress [G])

    def _set_tables(self, max_ctas: int) -> None:
        """Egress GB/s of a GPU with n pushing CTAs, and each CTA's equal share, for n in [0, max_ctas]."""
        n = np.arange(1, max_ctas + 1, dtype=np.float64)
        self._egress_gbs = np.r_[0.0, self._profile.bandwidth_gbs(n)]
        self._egress_share = np.r_[0.0, self._egress_gbs[1:] / n]

    def transfer(self, src: int, dst: int, nbytes: int) -> simpy.Event:
        """Start pushing `nbytes` from src to dst; the returned event fires when the last byte lands."""
        ev = self.env.event()
        if nbytes <= 0:
            return ev.succeed()
        nbytes = int(nbytes)
        self._advance()
        G = self._n_out.size
        target = self._served[src, dst] + nbytes
        self._seq += 1
        heapq.heappush(self._heaps[src * G + dst], (target, self._seq, nbytes, ev))
        self._head[src, dst] = min(self._head[src, dst], target)
        self._active[src, dst] += 1
        self._n_out[src] += 1
        self._n_in[dst] += 1
        if self._n_out[src] >= self._egress_gbs.size:  # more pushes than SMs: only direct fabric users
            self._set_tables(2 * int(self._n_out[src]))
        self._reschedule()
        return ev

    def _advance(self) -> None:
        now = self.env.now
        if now != self._last_ns:
            self._served += self._rate * (now - self._last_ns)
            self._last_ns = now

    def _reschedule(self) -> None:
        self._rate = self._fair_rates() if self.fairness == "maxmin" else self._share_rates()
        if self.record:
            flow = self._rate * self._active
            self.samples.append((self.env.now, flow.sum(axis=1), flow.sum(axis=0)))
        with np.errstate(invalid="ignore", divide="ignore"):
            eta = np.where(self._active > 0, (self._head - self._served) / self._rate, np.inf)
        t_min = float(eta.min()) if eta.size else math.inf
        if math.isinf(t_min):
            self._pending_ns = -1
            return
        when = self._last_ns + max(0, math.ceil(t_min - 1e-9))
        if when == self._pending_ns:
            return  # the pending timer already fires then
        self._token += 1
        self._pending_ns = when
        timer = self.env.timeout(when - self.env.now)
        token = self._token
        timer.callbacks.append(lambda _ev: self._on_timer(token))

    def _share_rates(self) -> np.ndarray:
        """Per-transfer GB/s on each pair: min(egress share, ingress share) (the default; an egress share never
        exceeds the per-CTA cap, which is the largest of them)."""
        return np.minimum(self._egress_share[self._n_out][:, None], self.ingress_gbs / np.maximum(self._n_in, 1))

    def _fair_rates(self) -> np.ndarray:
        """Per-transfer GB/s on each (src, dst) pair: max-min fair under the three capacities (water-filling).

        Each round raises every unfrozen transfer by the largest common step, then freezes the transfers of a
        saturated egress or ingress and those at the per-CTA cap; at most 2G + 1 rounds.
        """
        a = self._active.astype(np.float64)
        live = a > 0
        egress = self._egress_gbs[self._n_out]
        cap = self.flow_cap_gbs
        tol = 1e-9 * max(cap, 1.0)
        # Fast path: equal shares of each egress and ingress; fair iff every transfer is bottlenecked there.
        x = self._share_rates()
        flow = a * x
        full_e = flow.sum(axis=1) >= egress - tol
        full_i = flow.sum(axis=0) >= self.ingress_gbs - tol
        if not (live & ~(full_e[:, None] | full_i[None, :] | (x >= cap - tol))).any():
            self.fast_paths += 1
            return x
        self.water_fills += 1
        x = np.zeros_like(a)
        while live.any():
            flow = a * x
            left_e = egress - flow.sum(axis=1)
            left_i = self.ingress_gbs - flow.sum(axis=0)
            al = a * live
            with np.errstate(divide="ignore", invalid="ignore"):
                step_e = np.where(al.sum(axis=1) > 0, left_e / al.sum(axis=1), np.inf)
                step_i = np.where(al.sum(axis=0) > 0, left_i / al.sum(axis=0), np.inf)
            step = np.minimum(np.minimum(step_e[:, None], step_i[None, :]), cap - x)[live].min()
            x[live] += max(step, 0.0)
            flow = a * x
            full_e = flow.sum(axis=1) >= egress - tol
            full_i = flow.sum(axis=0) >= self.ingress_gbs - tol
            live &= ~(full_e[:, None] | full_i[None, :] | (x >= cap - tol))
        return x

    def _on_timer(self, token: int) -> None:
        if token != self._token:
            return  # superseded by a later reschedule
        self._pending_ns = -1
        self._advance()
        G = self._n_out.size
        for s, d in zip(*np.nonzero(self._head - self._served <= _DONE_BYTES)):
            heap = self._heaps[s * G + d]
            while heap and heap[0][0] - self._served[s, d] <= _DONE_BYTES:
                _, _, nbytes, ev = heapq.heappop(heap)
                self.delivered_bytes[s, d] += nbytes
                self._active[s, d] -= 1
                self._n_out[s] -= 1
                self._n_in[d] -= 1
                ev.succeed()
            self._head[s, d] = heap[0][0] if heap else np.inf
        self._reschedule()
