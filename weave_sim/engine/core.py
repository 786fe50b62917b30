"""The scheduler core: one long-lived SimPy process per SM executes a TaskGraph under a Plan.

Contract of `LayerSim.run()`: every task of the graph runs exactly once; a task starts only after all its
dependencies have ended (plus `signal` ns when a dependency finished on another GPU, plus a barrier's own
delay); an SM runs one task at a time. Time is integer ns on SimPy's own event queue.

Claiming. Ready tasks wait in per-GPU heaps, one per queue (control, dispatch, GEMM, reduce, combine),
ordered by (priority, task id). A worker that finishes a task claims the next one allowed to its role:
    comm role:    control, dispatch, combine, [GEMM if the plan steals bubbles], reduce
    compute role: GEMM, [combine once every GEMM task of its GPU is claimed, if all SMs join combine], reduce;
                  with combine in the epilogue: combine (whenever ready), GEMM, reduce
    any role (sequential plans, every SM): control, dispatch, combine, GEMM, reduce
The shared experts' GEMM tasks placed 'last' (graph.shared, dag.py) join their GPU's GEMM heap only once every
routed GEMM task of that GPU has been claimed, as the kernel's tile ticket hands them out after every routed tile.
A worker that finds nothing parks on its own event. When tasks become ready, parked workers are woken
role by role (compute before comm, so stolen GEMM tasks only go to comm SMs no compute SM wants), most
recently parked first (a LIFO stack). Barriers take no SM: they end when their dependencies have
ended plus their delay. Cross-GPU notifications of one finished task share one SimPy timeout.
Same-time order is SimPy's (time, priority, insertion order), so a run is a pure function of its
inputs and seed; the seed only draws the optional GEMM-time jitter.
"""
from __future__ import annotations

import heapq

import numpy as np
import simpy

from ..profile import HardwareProfile
from .dag import C_COMM, C_CTRL, C_GEMM, C_REDUCE, C_VIRTUAL, K_COMBINE, K_CTRL, SHARED_LAST, TaskGraph
from .hardware import ROLE_ANY, ROLE_COMM, ROLE_COMPUTE, NVLinkFabric
from .plan import Plan


_Q_COMBINE = 4  # queue index of combine tasks (queues 0-3 are the claim classes C_CTRL..C_REDUCE)


class LayerSim:
    """One simulation of `graph` under `plan` (see module docstring)."""

    def __init__(self, graph: TaskGraph, plan: Plan, profile: HardwareProfile, *, seed: int = 0,
                 jitter: float = 0.0, record_timeline: bool = False, fairness: str = "shares"):
        if plan.num_gpus != graph.num_gpus:
            raise ValueError(f"plan has {plan.num_gpus} GPUs, graph {graph.num_gpus}")
        plan.check(profile.num_sms)
        self.graph, self.plan, self.profile = graph, plan, profile
        self.env = simpy.Environment()
        self._eid_seen: int | None = None
        self.fabric = NVLinkFabric(self.env, graph.num_gpus, profile, record=record_timeline, fairness=fairness)
        fx = profile.fixed_ns
        self.signal_ns = int(fx["signal"])
        cls = graph.cls
        work = graph.work_ns.astype(np.float64)
        gemm = cls == C_GEMM
        jit = np.ones(graph.num_tasks)
        if jitter > 0:  # seeded multiplicative noise on GEMM times only
            rng = np.random.default_rng(seed)
            jit[gemm] = np.exp(jitter * rng.standard_normal(int(gemm.sum())))
            work[gemm] *= jit[gemm]
        claims = fx["task_claim"] * graph.tiles.astype(np.int64)
        dur = np.round(work).astype(np.int64) + claims
        self._dur = dur.tolist()
        # Concurrency (profile gemm.scale_by_ctas): a GEMM task's time is set when it starts, from the number n of
        # SMs of its GPU then running GEMM tasks (itself included): max(MMA time / scale(n), weight bytes at an
        # n-way share of HBM).
        self._conc = profile.gemm_scale is not None and graph.flop_ns is not None
        if self._conc:
            n = np.arange(profile.num_sms + 2, dtype=np.float64)
            self._inv_scale = (1.0 / profile.concurrency_scale(np.maximum(n, 1.0))).tolist()
            self._hbm_share = (np.maximum(n, 1.0) / profile.num_sms).tolist()
            self._flop = (graph.flop_ns * jit).tolist()
            self._hbm = (graph.hbm_ns * jit).tolist()
            self._claims = claims.tolist()
        self._running = [0] * graph.num_gpus  # GEMM tasks in flight per GPU (counted only with the scale)
        self._cls = cls.tolist()
        self._kind = graph.kind.tolist()
        # SMs that make the in-kernel decision after their GPU's count exchange (plan.decision_sms): busy until
        # hold[g][sm]; a task they claim before that starts then
        self._decide = list(plan.decision_sms) or None
        self._decision_ns = int(plan.decision_ns)
        self._hold = [[0] * profile.num_sms for _ in range(graph.num_gpus)]
        slot = cls.copy()
        slot[graph.kind == K_COMBINE] = _Q_COMBINE  # combine waits apart from dispatch (compute SMs may join it)
        self._slot = slot.tolist()
        self._gpu = graph.gpu.tolist()
        self._peer = graph.peer.tolist()
        self._bytes = graph.nbytes.tolist()
        self._prio = graph.prio.tolist()
        self._delay = graph.delay_ns.tolist()
        self._ptr = graph.dep_ptr.tolist()
        self._deps = graph.dep_idx.tolist()
        self._left = graph.num_deps.tolist()
        T, G, N = graph.num_tasks, graph.num_gpus, profile.num_sms
        self.start_ns = [-1] * T
        self.end_ns = [-1] * T
        self.sm = [-1] * T
        self.run_count = [0] * T  # times each task was executed (the tests check it is exactly 1)
        self._queues = [[[] for _ in range(5)] for _ in range(G)]
        self._idle = [[[] for _ in range(3)] for _ in range(G)]
        self._gemm_left = np.bincount(graph.gpu[cls == C_GEMM], minlength=G).tolist()
        # shared-expert tasks placed last: held per GPU until its routed GEMM tasks are all claimed
        self._last = None
        if graph.shared is not None and (graph.shared == SHARED_LAST).any():
            self._last = (graph.shared == SHARED_LAST).tolist()
            self._routed = (graph.shared == 0).tolist()
            self._routed_left = np.bincount(graph.gpu[(cls == C_GEMM) & (graph.shared == 0)], minlength=G).tolist()
            self._held: list[list[int]] = [[] for _ in range(G)]
        self._touched: set[int] = set()
        self._all_join = plan.all_join_combine
        self._epilogue = plan.combine_in_epilogue
        steal = [C_GEMM] if plan.steal else []
        if plan.combine_in_epilogue:  # ready result rows go out before the next GEMM task is taken
            compute = [_Q_COMBINE, C_GEMM, C_REDUCE]
        else:
            compute = [C_GEMM, _Q_COMBINE, C_REDUCE] if plan.all_join_combine else [C_GEMM, C_REDUCE]
        self._allowed = {ROLE_COMM: [C_CTRL, C_COMM, _Q_COMBINE, *steal, C_REDUCE],
                         ROLE_COMPUTE: compute,
                         ROLE_ANY: [C_CTRL, C_COMM, _Q_COMBINE, C_GEMM, C_REDUCE]}
        self.roles = np.full((G, N), ROLE_ANY, dtype=np.int8)
        if not plan.sequential:
            for g, c in enumerate(plan.num_comm_sms):
                self.roles[g, :c] = ROLE_COMM
                self.roles[g, c:] = ROLE_COMPUTE

    # --- running -------------------------------------------------------------------------------
    def start(self) -> "LayerSim":
        """Queue the tasks without dependencies and create the SM processes (time 0); `run` calls it."""
        for t in np.flatnonzero(self.graph.num_deps == 0).tolist():
            self._ready(t)
        G, N = self.roles.shape
        for g in range(G):
            for sm in range(N):
                self.env.process(self._worker(g, sm, int(self.roles[g, sm])))
        return self

    def run(self) -> "LayerSim":
        """Simulate to completion; raises RuntimeError if some task never ran (a deadlock)."""
        self.start()
        self.env.run()
        return self.finish()

    def finish(self) -> "LayerSim":
        """Check that every task ran (after the event queue drained)."""
        self._eid_seen = None
        missing = [t for t, e in enumerate(self.end_ns) if e < 0]
        if missing:
            raise RuntimeError(f"{len(missing)} tasks never ran under {self.plan.label} (first id {missing[0]})")
        return self

    @property
    def num_events(self) -> int:
        """Events scheduled on SimPy's queue so far (read from its tie-breaking counter; -1 if unavailable)."""
        eid = getattr(self.env, "_eid", None)  # SimPy 4 numbers every scheduled event with this counter
        if eid is None:
            return -1
        if self._eid_seen is None:
            self._eid_seen = next(eid)  # reading consumes one id: remember the value, read once
        return self._eid_seen

    def _worker(self, g: int, sm: int, role: int):
        env, fabric = self.env, self.fabric
        dur, cls, peer, nbytes = self._dur, self._cls, self._peer, self._bytes
        idle = self._idle[g][role]
        while True:
            t = self._pick(g, role)
            if t < 0:
                ev = env.event()
                idle.append(ev)
                t = yield ev
            if self._decide is not None and self._hold[g][sm] > env.now:
                yield env.timeout(self._hold[g][sm] - env.now)
            self.start_ns[t] = env.now
            self.sm[t] = sm
            self.run_count[t] += 1
            if cls[t] == C_COMM:
                if dur[t]:
                    yield env.timeout(dur[t])  # the claim, and a dispatch piece's fence and flag (dag.py)
                yield fabric.transfer(g, peer[t], nbytes[t])
            elif cls[t] == C_GEMM and self._conc:
                self._running[g] += 1
                n = min(self._running[g], len(self._hbm_share) - 1)
                yield env.timeout(self._claims[t] + round(max(self._flop[t] * self._inv_scale[n],
                                                              self._hbm[t] * self._hbm_share[n])))
                self._running[g] -= 1
            else:
                yield env.timeout(dur[t])
            self._finish(t)
            self._flush()

    def _pick(self, g: int, role: int) -> int:
        """Claim the best ready task for a worker of `role` on GPU g, or return -1."""
        queues = self._queues[g]
        for c in self._allowed[role]:
            heap = queues[c]
            if not heap:
                continue
            if c == _Q_COMBINE and role == ROLE_COMPUTE and self._gemm_left[g] > 0 and not self._epilogue:
                continue  # compute SMs join combine only after the last GEMM task is claimed
            t = heapq.heappop(heap)[1]
            if c == C_GEMM:
                self._gemm_left[g] -= 1
                if self._gemm_left[g] == 0 and self._all_join:
                    self._touched.add(g)  # parked compute SMs may now take combine tasks
                if self._last is not None and self._routed[t]:
                    self._routed_left[g] -= 1
                    if self._routed_left[g] == 0:
                        self._release_held(g)
            return t
        return -1

    def _release_held(self, g: int) -> None:
        """Queue GPU g's ready shared-expert tasks placed last (its routed GEMM tasks are all claimed)."""
        for t in self._held[g]:
            heapq.heappush(self._queues[g][self._slot[t]], (self._prio[t], t))
        if self._held[g]:
            self._touched.add(g)
        self._held[g] = []

    def claimable(self, g: int, role: int) -> bool:
        """Whether a worker of `role` on GPU g could claim a ready task now (read-only twin of _pick)."""
        queues = self._queues[g]
        for c in self._allowed[role]:
            if queues[c] and not (c == _Q_COMBINE and role == ROLE_COMPUTE and self._gemm_left[g] > 0
                                  and not self._epilogue):
                return True
        return False

    def parked(self, g: int, role: int) -> int:
        """Number of workers of `role` on GPU g parked waiting for work."""
        return len(self._idle[g][role])

    def _kick(self, g: int) -> None:
        """Wake parked workers of GPU g while some ready task suits them."""
        for role in (ROLE_COMPUTE, ROLE_COMM, ROLE_ANY):
            stack = self._idle[g][role]
            while stack:
                t = self._pick(g, role)
                if t < 0:
                    break
                stack.pop().succeed(t)

    def _flush(self) -> None:
        while self._touched:
            for g in sorted(self._touched):
                self._touched.discard(g)
                self._kick(g)

    def _ready(self, t: int) -> None:
        if self._cls[t] == C_VIRTUAL:
            self.start_ns[t] = self.env.now
            self.run_count[t] += 1
            if self._delay[t]:
                timer = self.env.timeout(self._delay[t])
                timer.callbacks.append(lambda _ev: (self._finish(t), self._flush()))
            else:
                self._finish(t)
            return
        g = self._gpu[t]
        if self._last is not None and self._last[t] and self._routed_left[g] > 0:
            self._held[g].append(t)  # claimable once every routed GEMM task of g is claimed (_pick)
            return
        heapq.heappush(self._queues[g][self._slot[t]], (self._prio[t], t))
        self._touched.add(g)

    def _finish(self, t: int) -> None:
        self.end_ns[t] = self.env.now
        g = self._gpu[t]
        if self._decide is not None and self._kind[t] == K_CTRL:  # the count exchange: the deciders decide now
            hold = self._hold[g]
            for sm in range(min(self._decide[g], len(hold))):
                hold[sm] = self.env.now + self._decision_ns
        cross = []
        for d in self._deps[self._ptr[t]:self._ptr[t + 1]]:
            if self._gpu[d] != g:
                cross.append(d)
                continue
            self._left[d] -= 1
            if self._left[d] == 0:
                self._ready(d)
        if cross:
            if self.signal_ns:
                timer = self.env.timeout(self.signal_ns)
                timer.callbacks.append(lambda _ev: self._release(cross))
            else:
                self._release(cross, flush=False)

    def _release(self, ids: list[int], flush: bool = True) -> None:
        for d in ids:
            self._left[d] -= 1
            if self._left[d] == 0:
                self._ready(d)
        if flush:
            self._flush()
