"""Where an engine's time goes while it runs: CUDA events around each pass's launch with host clocks around the
scheduler's phases (PassClock; pass_buckets groups its passes by row count), device time per kernel of one decode
step (step_kernels, torch.profiler; profiled_kernels for any callable), the scheduler's host work per decode step by
phase timers (step_profile), the kernels in a Triton cache (cache_entries), and few-row GEMM kernels left out of
start-up's choice (exclude_gemm_kernels)."""
from __future__ import annotations

import os
import time
from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity, profile

if TYPE_CHECKING:
    from radixlm.bench.datasets import PromptSource


class PassClock:
    """Wraps the scheduler's planning, launch and processing; records events and host time."""

    def __init__(self, engine):
        self.engine, self.sched = engine, engine.scheduler
        self.cuda = torch.cuda.is_available() and torch.device(engine.runner.device).type == "cuda"
        self.events: list[tuple] = []
        self.host = {"launch": 0.0, "process": 0.0, "plan": 0.0}
        self._orig = {}
        self._wrap(self.sched, "launch_batch", "launch", events=True)
        self._wrap(self.sched.results, "process_batch_result", "process")
        self._wrap(self.sched, "get_next_batch_to_run", "plan")

    def _wrap(self, obj, attr: str, key: str, events: bool = False) -> None:
        fn = getattr(obj, attr)
        self._orig[attr] = (obj, fn)

        def wrapped(*a, **kw):
            t0 = time.perf_counter()
            ev0 = ev1 = None
            if events and self.cuda:
                ev0 = torch.cuda.Event(enable_timing=True)
                ev0.record()
            try:
                return fn(*a, **kw)
            finally:
                if events and self.cuda:
                    ev1 = torch.cuda.Event(enable_timing=True)
                    ev1.record()
                    self.events.append((ev0, ev1, a[0].num_rows, a[0].is_prefill))
                self.host[key] += time.perf_counter() - t0
        setattr(obj, attr, wrapped)

    def detach(self) -> None:
        for attr, (obj, fn) in self._orig.items():
            setattr(obj, attr, fn)

    def passes(self) -> list[dict]:
        if not self.cuda:
            return []
        torch.cuda.synchronize()
        rows = []
        for i, (a, b, n, prefill) in enumerate(self.events):
            gap = self.events[i - 1][1].elapsed_time(a) * 1e3 if i else None
            rows.append({"rows": n, "prefill": prefill, "pass_us": a.elapsed_time(b) * 1e3, "gap_us": gap})
        return rows


# The attention kernels (radixlm/runtime/kernels/attention/: paged decode and extend, MLA's, the shared-prefix stage,
# deterministic mode's fixed-split kernel), so that a step's attention time reads apart from its GEMMs'.
ATTENTION_KERNELS = frozenset({"_decode_stage1", "_decode_stage2", "_extend_kernel", "_shared_prefix_stage1",
                               "_mla_decode_stage1", "_mla_decode_stage2", "_mla_extend_kernel",
                               "_fixed_split_attention_kernel"})


def attention_us(us: dict[str, float]) -> float:
    """The attention kernels' share of a kernel-name -> device-microseconds table."""
    return sum(v for n, v in us.items() if n in ATTENTION_KERNELS and v > 0)


def profiled_kernels(fn) -> tuple[float, Counter, Counter]:
    """fn() under torch.profiler: (wall seconds, device microseconds per kernel name, launches per kernel name);
    without CUDA (a CPU dry run) the aten ops' own CPU time instead."""
    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    us, calls = Counter(), Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name] += e.device_time
            calls[e.name] += 1
        elif not cuda and e.name.startswith("aten::") and e.self_cpu_time_total > 0:
            us[e.name] += e.self_cpu_time_total
            calls[e.name] += 1
    return wall, us, calls


def kernel_times(engine, prompts, n_out: int) -> tuple[float, Counter, Counter]:
    """profiled_kernels of one generate call."""
    from benchmarks.lib.engine import greedy  # radixlm imported only where an engine runs (not for cache_entries)

    return profiled_kernels(lambda: engine.generate(input_ids=prompts, sampling_params=greedy(n_out)))


def step_kernels(engine, src: PromptSource, batch: int, steps: int, top: int = 14) -> dict:
    """One decode step at this batch size: wall, device-busy and attention microseconds, and the top kernels by device
    time."""
    w1, k1, c1 = kernel_times(engine, [src.ids(512) for _ in range(batch)], 1)
    w2, k2, c2 = kernel_times(engine, [src.ids(512) for _ in range(batch)], 1 + steps)
    per_step = {n: (k2[n] - k1.get(n, 0)) / steps for n in k2}
    launches = {n: (c2[n] - c1.get(n, 0)) / steps for n in c2}
    busy = sum(v for v in per_step.values() if v > 0)
    wall = (w2 - w1) / steps * 1e6
    ranked = sorted(per_step.items(), key=lambda kv: -kv[1])[:top]
    return {"batch": batch, "wall_us_per_step": wall, "gpu_busy_us_per_step": busy, "idle_us_per_step": wall - busy,
            "launches_per_step": sum(v for v in launches.values() if v > 0),
            "attention_us_per_step": attention_us(per_step),
            "kernels": [{"name": n[:120], "us_per_step": v, "launches_per_step": launches[n]} for n, v in ranked]}


def pass_clock(engine, src: PromptSource, batch: int, steps: int) -> dict:
    """The same decode steps under PassClock: each decode pass's device time (CUDA events around its launch) and the
    idle gap before it, medians, and the host's plan / launch / process seconds per step. A gap near zero with busy
    below wall in step_kernels points at gaps inside the pass (between a graph's kernels); a large one at the host."""
    import statistics

    from benchmarks.lib.engine import greedy

    clock = PassClock(engine)
    try:
        engine.generate(input_ids=[src.ids(512) for _ in range(batch)], sampling_params=greedy(1 + steps))
        passes = [p for p in clock.passes() if not p["prefill"]]
    finally:
        clock.detach()
    gaps = [p["gap_us"] for p in passes if p["gap_us"] is not None]
    return {"decode_passes": len(passes),
            "pass_us_median": statistics.median(p["pass_us"] for p in passes) if passes else None,
            "gap_us_median": statistics.median(gaps) if gaps else None,
            "host_us_per_step": {k: v / max(len(passes), 1) * 1e6 for k, v in clock.host.items()}}


def step_profile(engine, src: PromptSource, batch: int, steps: int = 32) -> dict:
    """Where rank 0's decode step goes, by host timers (torch.profiler crashed the process on nvidia-h200-x2): the
    scheduler's own work per step, and the part of it spent waiting for the device's results. Waiting near zero: the
    host bounds the step; otherwise the device does (kernels and communication)."""
    from benchmarks.lib.engine import greedy
    from benchmarks.lib.phases import PhaseTimer

    def run(n_out: int) -> tuple[float, dict]:
        prompts = [src.ids(512) for _ in range(batch)]
        timer = PhaseTimer.attach(engine)
        t0 = time.perf_counter()
        try:
            engine.generate(input_ids=prompts, sampling_params=greedy(n_out))
        finally:
            timer.detach()
        return time.perf_counter() - t0, timer.as_dict()

    w1, p1 = run(1)
    w2, p2 = run(1 + steps)

    def per_step(label: str) -> float:
        return (p2.get(label, {}).get("seconds", 0.0) - p1.get(label, {}).get("seconds", 0.0)) / steps * 1e6

    wall, step, wait = (w2 - w1) / steps * 1e6, per_step("scheduler step"), per_step("wait for device")
    phases = {k: per_step(k) for k in p2 if k != "cuda allocator"}
    return {"batch": batch, "wall_us": wall, "scheduler_step_us": step, "wait_for_device_us": wait,
            "host_busy_us": step - wait, "phases_us_per_step": phases}


def cache_entries(cache_dir: str) -> int:
    """Kernels in a Triton cache directory: one folder per compiled kernel, holding its metadata JSON."""
    if not os.path.isdir(cache_dir):
        return 0
    return sum(1 for d in os.scandir(cache_dir) if d.is_dir() and any(f.name.endswith(".json") and
                                                                        not f.name.startswith("__grp__")
                                                                        for f in os.scandir(d.path)))


PASS_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)  # decode passes by rows: up to each bound


def exclude_gemm_kernels(names: list[str]) -> None:
    """Start-up's few-row GEMM choice leaves these kernels out (their GEMMs take the others or cuBLAS)."""
    from radixlm.runtime.kernels.gemm import dispatch as gemm

    excluded = {gemm.GemmKernel[n.upper()] for n in names}
    fastest = gemm._fastest

    def without(kernels, *rest):
        kept = {k: fn for k, fn in kernels.items() if k not in excluded}
        return fastest(kept, *rest) if kept else gemm.GemmKernel.CUBLAS

    gemm._fastest = without


def pass_buckets(passes: list[dict]) -> list[dict]:
    """PassClock.passes() grouped: prefill passes, decode passes by row count (PASS_BUCKETS); each group's passes,
    mean device time, mean idle gap before them, and share of the run's device span."""
    rows = []
    groups: dict[str, list[dict]] = {}
    for p in passes:
        key = "prefill" if p["prefill"] else f"<= {next((b for b in PASS_BUCKETS if p['rows'] <= b), 'more')}"
        groups.setdefault(key, []).append(p)
    total = sum(p["pass_us"] + (p["gap_us"] or 0.0) for p in passes) or 1.0
    for key in ["prefill"] + [f"<= {b}" for b in PASS_BUCKETS] + ["<= more"]:
        ps = groups.get(key)
        if not ps:
            continue
        gaps = [p["gap_us"] for p in ps if p["gap_us"] is not None]
        busy = sum(p["pass_us"] for p in ps)
        idle = sum(gaps)
        rows.append({"bucket": key, "passes": len(ps), "pass_us_mean": busy / len(ps),
                     "gap_us_mean": idle / len(gaps) if gaps else None, "busy_s": busy / 1e6, "idle_s": idle / 1e6,
                     "share": (busy + idle) / total})
    return rows
