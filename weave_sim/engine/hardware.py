"""Hardware in SimPy: NVLink as a fluid, bandwidth-shared fabric, and the SM roles.

(The SM worker process itself lives in core.py: it is the scheduler's claim loop.)

NVLink model (all rates in GB/s = bytes/ns). Each active transfer is pushed by one CTA of the source GPU.
With n transfers leaving GPU s and m entering GPU d, a transfer s->d moves at
    min(BW(n) / n, ingress_peak / m)
where BW(n) is the profile's push curve (about 20 GB/s per CTA, plateau near 365 GB/s) and ingress_peak
its NVLink peak. Rates change only when a transfer starts or ends; transfers of one (s, d) pair all move
at the same rate, so the fabric keeps one cumulative "bytes served per transfer" clock per pair and a heap
of finish targets, and holds a single pending SimPy timeout: the earliest finish (rounded up to an integer
ns). Cost per start or finish is O(G^2) numpy work, independent of the number of active transfers.
This is not max-min fair: bandwidth one flow cannot use is not handed to others (conservative).
Same-time order: transfers due at one instant complete in (src, dst) row-major order, and within a pair
by (finish target, start order); their events then resume the waiting SMs in that order.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
import simpy

from ..profile import HardwareProfile

ROLE_COMM, ROLE_COMPUTE, ROLE_ANY = 0, 1, 2
ROLE_NAMES = ("comm", "compute", "any")
_DONE_BYTES = 1e-3  # a transfer within a thousandth of a byte of its target is complete (float slack)


class NVLinkFabric:
    """Per-GPU egress and ingress bandwidth shared by the active transfers (see module docstring)."""

    def __init__(self, env: simpy.Environment, num_gpus: int, profile: HardwareProfile, record: bool = False):
        self.env = env
        G = num_gpus
        self._profile = profile
        self._share_gbs = self.per_cta_gbs(profile, profile.num_sms)
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
        self.samples: list[tuple[int, np.ndarray, np.ndarray]] = []  # (t_ns, egress GB/s [G], ingress [G])

    @staticmethod
    def per_cta_gbs(profile: HardwareProfile, max_ctas: int) -> np.ndarray:
        """[max_ctas + 1]: push GB/s of each CTA when n CTAs of one GPU push at once (0 for n = 0)."""
        n = np.arange(1, max_ctas + 1, dtype=np.float64)
        return np.r_[0.0, profile.bandwidth_gbs(n) / n]

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
        if self._n_out[src] >= self._share_gbs.size:  # more pushes than SMs: only direct fabric users
            self._share_gbs = self.per_cta_gbs(self._profile, 2 * int(self._n_out[src]))
        self._reschedule()
        return ev

    def _advance(self) -> None:
        now = self.env.now
        if now != self._last_ns:
            self._served += self._rate * (now - self._last_ns)
            self._last_ns = now

    def _reschedule(self) -> None:
        self._rate = np.minimum(self._share_gbs[self._n_out][:, None],
                                self.ingress_gbs / np.maximum(self._n_in, 1)[None, :])
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
