"""GPU side of `python -m weave_kernel.calibrate`: one symmetric buffer, the launches of the calibration kernels
(csrc/calib.cuh, through the extension's calib_* bindings), their timing, and checks that the timed kernels did
their work (received rows equal the sent rows; GEMM output matches torch; failures are recorded, not raised).
Run under torchrun, or as one process (world size 1)."""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from .build import load_extension
from .policies import dispatch_issuers
from .gpu_state import GpuStateSampler, power_limit_w, sustained_ms
from .symm import SymmetricBuffer, cuda_time_ms, init_ranks
from .calibrate import (BLOCK_ROWS, GEMM_K, GEMM_N, ROW_BYTES, TILE_N, TIMEOUT_NS, Plan, assemble,
                        driver_version, experts_for, span_ns, today_utc, useful_tflops)

# symmetric buffer layout, bytes (identical on every rank)
OFF_START = 0          # u64 [world]: push start flags (epoch)
OFF_SIGNAL = 512       # u64 [2]: ping-pong flags
OFF_BLK = 4096         # u64 [world][calib_max_blocks]: push block flags
OFF_DST = 1 << 20      # push receive slots [world][slot_bytes]
SEED = 1234
HIDDEN = ROW_BYTES // 2


class Bench:
    """One rank's calibration run. Every method is collective: all ranks call it in the same order."""

    def __init__(self, rank: int, world: int, distributed: bool):
        self.rank, self.world, self.distributed = rank, world, distributed
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.ext = load_extension()
        self.num_sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
        self.err = torch.zeros(4, dtype=torch.int32, device=self.dev)
        self.epoch = 0
        self.signal_base = 0
        self.failed_checks: list[str] = []
        self.t_start = time.time()
        self.dispatch = "threads"  # the push points' copy code (calibrate --dispatch)

    @classmethod
    def start(cls) -> "Bench":
        if not torch.cuda.is_available():
            raise SystemExit("weave_kernel.calibrate needs a CUDA GPU")
        distributed = "WORLD_SIZE" in os.environ
        rank = int(os.environ.get("RANK", 0))
        if distributed:
            init_ranks()
        else:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        world = dist.get_world_size() if distributed else 1
        if world > 8:
            raise SystemExit("weave_kernel.calibrate: at most 8 ranks (one node)")
        return cls(dist.get_rank() if distributed else 0, world, distributed)

    def close(self) -> None:
        if self.distributed:
            dist.destroy_process_group()

    # ---- helpers --------------------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[{time.time() - self.t_start:6.1f} s] {msg}", flush=True)

    def fail(self, msg: str) -> None:
        """A timed kernel did not do its work: recorded in the JSON ("failed_checks") and printed, not raised,
        so that one device run still returns every other number."""
        self.failed_checks.append(msg)
        print(f"CHECK FAILED on rank {self.rank}: {msg}", flush=True)

    def gather(self, value) -> list:
        if not self.distributed:
            return [value]
        out = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    @property
    def stream(self) -> int:
        return torch.cuda.current_stream(self.dev).cuda_stream

    def sync_params(self) -> dict:
        return {"err": self.err.data_ptr(), "timeout_ns": TIMEOUT_NS}

    def check(self, what: str) -> None:
        torch.cuda.synchronize(self.dev)
        e = self.err.tolist()
        if e[0]:
            raise RuntimeError(f"{what}: kernel error code {e[0]} (CTA {e[1]}, detail {e[2]}, {e[3]}; "
                               "codes in csrc/params.h: 3 grid barrier, 4 push start, 5 signal timeout)")

    def time_ms(self, fn, repeats: int, what: str) -> float:
        """Median of `repeats` CUDA-event timings of fn() after one warm-up call."""
        fn()
        self.check(what)
        t = cuda_time_ms(fn, 0, repeats)
        self.check(what)
        return t

    def alloc_symmetric(self, nbytes: int) -> None:
        """As MoEMegakernel: symmetric memory with peer base addresses (plain memory for one rank), zeroed."""
        self.symm_buf = SymmetricBuffer(nbytes, self.dev, self.world, self.rank)
        self.symm = self.symm_buf.tensor
        self.peer_ptrs = self.symm_buf.peer_ptrs
        self.peer_base = self.symm_buf.peer_base(self.dev)
        self.barrier()

    # ---- measurements -----------------------------------------------------------------------------------
    def push(self, plan: Plan) -> list[dict]:
        """nvlink_push points for 1..world-1 peers x plan.push_ctas."""
        if self.world == 1:
            self.log("nvlink_push: skipped, one GPU has no peers (weave-sim calibrate needs nvlink_push: run "
                     "with --nproc_per_node >= 2)")
            return []
        blocks = plan.push_blocks
        slot_bytes = blocks * BLOCK_ROWS * ROW_BYTES
        src = self.source_rows(self.rank, blocks)
        times = torch.zeros(2 * max(plan.push_ctas), dtype=torch.int64, device=self.dev)
        points = []
        for peers in range(1, self.world):
            for ctas in plan.push_ctas:
                rates = []
                for i in range(1 + plan.repeats):
                    self.epoch += 1
                    params = {**self.sync_params(), "peer_base": self.peer_base.data_ptr(), "src": src.data_ptr(),
                              "off_start_flag": OFF_START, "off_blk_flag": OFF_BLK, "off_dst": OFF_DST,
                              "slot_bytes": slot_bytes, "times": times.data_ptr(), "rank": self.rank,
                              "world": self.world, "num_peers": peers, "num_blocks": blocks,
                              "block_rows": BLOCK_ROWS, "row_chunks": ROW_BYTES // 16, "epoch": self.epoch,
                              "dispatch_bulk": dispatch_issuers(self.dispatch)}
                    self.ext.calib_push(params, ctas, self.stream)
                    self.check(f"push ({ctas} CTAs, {peers} peers)")
                    if i:
                        rates.append(blocks * BLOCK_ROWS * ROW_BYTES / span_ns(times.tolist(), ctas))
                by_rank = [round(r, 2) for r in self.gather(statistics.median(rates))]
                points.append({"ctas": ctas, "peers": peers, "gbs": min(by_rank), "gbs_by_rank": by_rank})
            self.barrier()  # every rank's rows have landed
            self.verify_push(peers, blocks, slot_bytes)
            self.barrier()
            self.log(f"nvlink_push, {peers} peer(s): " + ", ".join(
                f"{p['ctas']}: {p['gbs']:.0f}" for p in points if p["peers"] == peers) + " GB/s")
        return points

    def source_rows(self, rank: int, blocks: int) -> torch.Tensor:
        g = torch.Generator(device=self.dev)
        g.manual_seed(SEED + rank)
        return torch.randn(blocks * BLOCK_ROWS, HIDDEN, generator=g, device=self.dev, dtype=torch.bfloat16)

    def verify_push(self, peers: int, blocks: int, slot_bytes: int) -> None:
        """The rows each source pushed here last equal its source rows (block b -> row block b // peers)."""
        for s in range(self.world):
            q = (self.rank - s - 1) % self.world
            if s == self.rank or q >= peers:
                continue
            sent = self.source_rows(s, blocks).view(blocks, BLOCK_ROWS, HIDDEN)[q::peers].reshape(-1, HIDDEN)
            slot = self.symm[OFF_DST + s * slot_bytes:OFF_DST + (s + 1) * slot_bytes].view(torch.bfloat16)
            got = slot.view(-1, HIDDEN)[:sent.shape[0]]
            if not torch.equal(got, sent):
                self.fail(f"push: rows from rank {s} ({peers} peers) differ on rank {self.rank}")

    def gemm_call(self, a, b, c, tickets, grid_bar, experts: int, rows: int, ctas: int, chunks: int):
        params = {**self.sync_params(), "a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr(),
                  "tickets": tickets.data_ptr(), "grid_bar": grid_bar.data_ptr(), "num_experts": experts,
                  "rows_per_expert": rows, "n": GEMM_N, "k": GEMM_K, "num_chunks": chunks}
        return lambda: self.ext.calib_gemm(params, ctas, self.stream)

    def verify_gemm(self, a, b, c, experts: int, rows: int, what: str) -> None:
        for e in sorted({0, experts - 1}):
            x = a[e * rows:(e + 1) * rows].float()
            ref = x @ b[e].float().t()
            got = c[e * rows:(e + 1) * rows].float()
            den, err = ref.norm().item(), (got - ref).norm().item()
            rel = err / den if den > 0 else err  # an all-zero A (the padding runs) must give exact zeros
            if not rel < 1e-2:
                self.fail(f"{what}: expert {e} output rel. error {rel:.2e} against torch (limit 1e-2)")

    def gemm_and_chunks(self, plan: Plan) -> tuple[list[dict], list[dict]]:
        experts = {r: experts_for(r, plan.gemm_tiles) for r in plan.gemm_rows}
        max_e = max([*experts.values(), plan.chunk_experts])
        max_rows = max([e * r for r, e in experts.items()] + [plan.chunk_experts * plan.chunk_rows])
        b = (torch.randn(max_e, GEMM_N, GEMM_K, device=self.dev, dtype=torch.bfloat16) * GEMM_K ** -0.5)
        a = torch.randn(max_rows, GEMM_K, device=self.dev, dtype=torch.bfloat16)
        c = torch.empty(max_rows, GEMM_N, device=self.dev, dtype=torch.bfloat16)
        tickets = torch.zeros(max(plan.chunk_counts), dtype=torch.int32, device=self.dev)
        grid_bar = torch.zeros(2, dtype=torch.int32, device=self.dev)
        gemm = []
        for rows in plan.gemm_rows:
            e = experts[rows]
            for i, n in enumerate(plan.gemm_ctas):
                ctas = self.num_sms if n == 0 else min(n, self.num_sms)
                what = f"gemm ({e} experts x {rows} rows, {ctas} CTAs)"
                ms = self.time_ms(self.gemm_call(a, b, c, tickets, grid_bar, e, rows, ctas, 1), plan.repeats, what)
                if i == 0:
                    self.verify_gemm(a, b, c, e, rows, what)
                by_rank = [round(x, 2) for x in self.gather(useful_tflops(e, rows, ms))]
                gemm.append({"ctas": ctas, "rows_per_expert": rows, "tflops": round(statistics.mean(by_rank), 2),
                             "experts": e, "ms": round(ms, 4), "tflops_by_rank": by_rank})
            self.log(f"gemm {rows:>5} rows/expert x {e:>3} experts: " + ", ".join(
                f"{p['ctas']}: {p['tflops']:.0f}" for p in gemm if p["rows_per_expert"] == rows) + " TF/s")
        chunks = []
        e, rows = plan.chunk_experts, plan.chunk_rows
        for k in plan.chunk_counts:
            what = f"chunks (K={k}, {e} experts x {rows} rows, {self.num_sms} CTAs)"
            ms = self.time_ms(self.gemm_call(a, b, c, tickets, grid_bar, e, rows, self.num_sms, k), plan.repeats, what)
            self.verify_gemm(a, b, c, e, rows, what)
            by_rank = self.gather(ms * 1e6)
            chunks.append({"chunks": k, "time_ns": round(statistics.mean(by_rank), 1),
                           "time_ns_by_rank": [round(t, 1) for t in by_rank]})
        self.log("chunks: " + ", ".join(f"K={p['chunks']}: {p['time_ns'] / 1e3:.1f} us" for p in chunks))
        return gemm, chunks

    def gemm_by_k(self, plan: Plan) -> list[dict]:
        """The GEMM tile at each K of plan.k_values, plan.k_rows rows per expert, on plan.k_ctas CTAs: per point
        the time per tile (call time x CTAs / tiles, mean over ranks). Outputs checked against torch once per K."""
        points = []
        ctas = min(plan.k_ctas, self.num_sms)
        for rows in plan.k_rows:
            e = experts_for(rows, plan.k_tiles)
            tiles = e * -(-rows // BLOCK_ROWS) * (GEMM_N // TILE_N)
            for k in plan.k_values:
                b = torch.randn(e, GEMM_N, k, device=self.dev, dtype=torch.bfloat16) * k ** -0.5
                a = torch.randn(e * rows, k, device=self.dev, dtype=torch.bfloat16)
                c = torch.empty(e * rows, GEMM_N, device=self.dev, dtype=torch.bfloat16)
                tickets = torch.zeros(8, dtype=torch.int32, device=self.dev)
                grid_bar = torch.zeros(2, dtype=torch.int32, device=self.dev)
                params = {**self.sync_params(), "a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr(),
                          "tickets": tickets.data_ptr(), "grid_bar": grid_bar.data_ptr(), "num_experts": e,
                          "rows_per_expert": rows, "n": GEMM_N, "k": k, "num_chunks": 1}
                what = f"gemm K={k} ({e} experts x {rows} rows, {ctas} CTAs)"
                fn = lambda: self.ext.calib_gemm(params, ctas, self.stream)  # noqa: E731
                ms = self.time_ms(fn, plan.repeats, what)
                c.fill_(float("nan"))  # poisoned: the check sees one more call's outputs, every element
                fn()
                self.check(what)
                self.verify_gemm(a, b, c, e, rows, what)
                tile_us = statistics.mean(self.gather(ms * 1e3 * ctas / tiles))
                points.append({"k": k, "ctas": ctas, "rows_per_expert": rows, "experts": e, "tiles": tiles,
                               "tile_us": round(tile_us, 3)})
                del a, b, c
            self.log(f"tile us by K ({rows} rows/expert, {ctas} CTAs): " + ", ".join(
                f"{p['k']}: {p['tile_us']:.2f}" for p in points if p["rows_per_expert"] == rows))
        return points

    def power(self, plan: Plan) -> dict | None:
        """Sustained GEMM (2048 rows per expert) at plan.power_ctas, then a sustained 1 GiB device copy, with this
        rank's SM clock and board power, every rank at once; per point the rank that drew the most power. None if
        nvidia-smi does not answer."""
        if not plan.power_ctas:
            return None
        sampler = GpuStateSampler.for_device(self.dev, period_ms=50)
        ok = all(self.gather(sampler.reason_field is not None))
        if not ok:
            sampler.stop()
            self.log("power: skipped (nvidia-smi did not answer on every rank)")
            return None
        rows = 2048
        e = experts_for(rows, plan.gemm_tiles)
        b = torch.randn(e, GEMM_N, GEMM_K, device=self.dev, dtype=torch.bfloat16) * GEMM_K ** -0.5
        a = torch.randn(e * rows, GEMM_K, device=self.dev, dtype=torch.bfloat16)
        c = torch.empty(e * rows, GEMM_N, device=self.dev, dtype=torch.bfloat16)
        tickets = torch.zeros(8, dtype=torch.int32, device=self.dev)
        grid_bar = torch.zeros(2, dtype=torch.int32, device=self.dev)
        points = []
        try:
            def sustained_point(a_in, ctas: int, what: str, extra: dict) -> dict:
                """One sustained GEMM on `ctas` CTAs, checked; the point of the rank that drew the most power."""
                fn = self.gemm_call(a_in, b, c, tickets, grid_bar, e, rows, ctas, 1)
                fn()
                self.check(what)
                self.barrier()
                ms, t0, t1 = sustained_ms(fn, plan.power_sustain_s)
                self.check(what)
                st = sampler.summary(t0, t1) or {}
                mine = {"ctas": ctas, **extra, "tflops": round(useful_tflops(e, rows, ms), 1),
                        "sm_mhz": st.get("sm_mhz_median"), "power_w": st.get("power_w_max"),
                        "power_w_median": st.get("power_w_median"), "event_reasons": st.get("event_reasons", []),
                        "gpu": st.get("gpu")}
                return max(self.gather(mine), key=lambda p: p["power_w"] or 0.0)

            for n in plan.power_ctas:
                ctas = self.num_sms if n == 0 else min(n, self.num_sms)
                points.append(sustained_point(a, ctas, f"power gemm ({ctas} CTAs)", {}))
            self.verify_gemm(a, b, c, e, rows, "power gemm")
            pad_points = []
            for z in plan.power_pad_rows:  # padding rows: the last z of every block zeroed, all SMs
                what = f"power gemm ({z} zero rows per block)"
                az = a.clone()
                az.view(e * rows // BLOCK_ROWS, BLOCK_ROWS, GEMM_K)[:, BLOCK_ROWS - z:] = 0
                pad_points.append(sustained_point(az, self.num_sms, what,
                                                  {"pad_rows": z, "pad_fraction": round(z / BLOCK_ROWS, 4)}))
                self.verify_gemm(az, b, c, e, rows, what)
                del az
            del a, b, c
            src = torch.empty(1 << 30, dtype=torch.uint8, device=self.dev)
            dst = torch.empty_like(src)
            self.barrier()
            ms, t0, t1 = sustained_ms(lambda: dst.copy_(src), plan.power_sustain_s)
            st = sampler.summary(t0, t1) or {}
            mine = {"tbs": round(2 * src.numel() / (ms * 1e9), 3), "power_w": st.get("power_w_max"),
                    "power_w_median": st.get("power_w_median"), "sm_mhz": st.get("sm_mhz_median"),
                    "event_reasons": st.get("event_reasons", []), "gpu": st.get("gpu")}
            hbm = max(self.gather(mine), key=lambda p: p["power_w"] or 0.0)
            del src, dst
        finally:
            sampler.stop()
        limit = power_limit_w(sampler.ident)
        self.log("power: " + ", ".join(f"{p['ctas']}: {p['tflops']:.0f} TF/s {p['sm_mhz']:.0f} MHz "
                                         f"{p['power_w']:.0f} W" for p in points)
                 + f"; HBM copy {hbm['tbs']:.2f} TB/s {hbm['power_w']:.0f} W (limit {limit} W)")
        if pad_points:
            self.log("power, zero rows per block: " + ", ".join(
                f"{p['pad_rows']}: {p['tflops']:.0f} TF/s {p['sm_mhz']:.0f} MHz {p['power_w']:.0f} W" for p in pad_points))
        out = {"limit_w": limit, "rows_per_expert": rows, "sustain_s": plan.power_sustain_s, "points": points,
               "hbm": hbm}
        if pad_points:
            out["pad_points"] = pad_points
        return out

    def claim_ns(self, plan: Plan, ctas: int) -> float:
        """Mean time of one ticket claim per CTA with `ctas` CTAs claiming back to back (median of repeats)."""
        counter = torch.zeros(1, dtype=torch.int32, device=self.dev)
        times = torch.zeros(2 * ctas, dtype=torch.int64, device=self.dev)
        claims = torch.zeros(ctas, dtype=torch.int32, device=self.dev)
        params = {**self.sync_params(), "counter": counter.data_ptr(), "times": times.data_ptr(),
                  "claims": claims.data_ptr(), "total_tickets": ctas * plan.claims_per_cta}
        vals = []
        for i in range(1 + plan.repeats):
            self.ext.calib_claim(params, ctas, self.stream)
            self.check(f"claim ({ctas} CTAs)")
            t, n = times.tolist(), claims.tolist()
            if i:
                vals.append(statistics.mean((t[2 * j + 1] - t[2 * j]) / n[j] for j in range(ctas)))
        return statistics.median(vals)

    def signal_ns(self, plan: Plan) -> float:
        """One-way flag latency: ping-pong round trip / 2 (rank 0 <-> rank 1, or two CTAs of one GPU)."""
        own = self.peer_ptrs[self.rank] + OFF_SIGNAL
        if self.world == 1:
            ctas, role0, wait, post = 2, 0, [own, own + 8], [own + 8, own]
        elif self.rank < 2:
            ctas, role0, wait, post = 1, self.rank, [own], [self.peer_ptrs[1 - self.rank] + OFF_SIGNAL]
        else:
            ctas = 0
        times = torch.zeros(2, dtype=torch.int64, device=self.dev)
        warmup = plan.signal_rounds // 10
        vals = []
        for i in range(1 + plan.repeats):
            if ctas:
                params = {**self.sync_params(), "wait": wait, "post": post, "times": times.data_ptr(),
                          "base": self.signal_base, "role0": role0, "rounds": plan.signal_rounds, "warmup": warmup}
                self.ext.calib_signal(params, ctas, self.stream)
                self.check("signal ping-pong")
                t = times.tolist()
                if i and self.rank == 0:
                    vals.append((t[1] - t[0]) / (plan.signal_rounds - warmup) / 2)
            self.signal_base += plan.signal_rounds
        return self.gather(statistics.median(vals) if vals else None)[0]

    def hbm_gbs(self, plan: Plan) -> float:
        src = torch.empty(plan.hbm_bytes, dtype=torch.uint8, device=self.dev)
        dst = torch.empty_like(src)
        ms = self.time_ms(lambda: dst.copy_(src), plan.repeats, "hbm copy")
        return statistics.mean(self.gather(2 * plan.hbm_bytes / (ms * 1e6)))

    # ---- the whole run ----------------------------------------------------------------------------------
    def run(self, plan: Plan, commit: str) -> dict:
        slot = plan.push_blocks * BLOCK_ROWS * ROW_BYTES
        self.alloc_symmetric(OFF_DST + (self.world * slot if self.world > 1 else 0))
        self.log(f"{self.world} rank(s), {torch.cuda.get_device_name(self.dev)}, {self.num_sms} SMs")
        signal = self.signal_ns(plan)
        claim = statistics.mean(self.gather(self.claim_ns(plan, self.num_sms)))
        claim_one = statistics.mean(self.gather(self.claim_ns(plan, 1)))
        self.log(f"signal {signal:.0f} ns ({'rank 0 <-> rank 1' if self.world > 1 else 'own memory'}), "
                 f"task claim {claim:.0f} ns ({self.num_sms} CTAs), {claim_one:.0f} ns (1 CTA)")
        push = self.push(plan)
        gemm, chunks = self.gemm_and_chunks(plan)
        by_k = self.gemm_by_k(plan) if plan.k_values else []
        hbm = self.hbm_gbs(plan)
        power = self.power(plan)
        header = {"gpu_name": torch.cuda.get_device_name(self.dev), "driver": driver_version(torch),
                  "date": today_utc(), "commit": commit, "num_sms": self.num_sms}
        extra = {
            "world": self.world, "torch": torch.__version__, "cuda": torch.version.cuda,
            "signal_path": "rank 0 <-> rank 1 over NVLink" if self.world > 1 else "two CTAs, own memory (one GPU)",
            "task_claim_1cta_ns": round(claim_one, 1),
            "dispatch": self.dispatch,
            "config": {"push_row_bytes": ROW_BYTES, "push_block_rows": BLOCK_ROWS, "push_blocks": plan.push_blocks,
                       "gemm_n": GEMM_N, "gemm_k": GEMM_K, "gemm_tiles": plan.gemm_tiles,
                       "chunk_experts": plan.chunk_experts, "chunk_rows": plan.chunk_rows,
                       "claims_per_cta": plan.claims_per_cta, "signal_rounds": plan.signal_rounds,
                       "hbm_bytes": plan.hbm_bytes, "repeats": plan.repeats, "power_ctas": list(plan.power_ctas),
                       "power_sustain_s": plan.power_sustain_s,
                       "power_pad_rows": list(plan.power_pad_rows), "k_values": list(plan.k_values),
                       "k_rows": list(plan.k_rows), "k_ctas": plan.k_ctas, "k_tiles": plan.k_tiles},
            "failed_checks": [m for ms in self.gather(self.failed_checks) for m in ms],
            "wall_s": round(time.time() - self.t_start, 1),
        }
        return assemble(header, push, gemm, chunks, task_claim_ns=claim, signal_ns=signal, hbm_gbs=hbm, power=power,
                        extra=extra, gemm_by_k=by_k)
