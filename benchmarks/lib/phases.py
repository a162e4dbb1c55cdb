"""Where an offline run's wall time goes, by phase, without a profiler's distortion: wraps a few of the engine's
methods with perf_counter timers (a wrapper costs about a microsecond; the phases run per pass or per request).

    timer = PhaseTimer.attach(engine)   # before the measured generate
    ...
    timer.detach(); timer.table(passes)

Times are inclusive (a phase contains the phases it calls); `wait for device` is the time spent waiting for a
pass's results to reach the host; garbage collections are timed too (they may run inside any phase)."""
from __future__ import annotations

import cProfile
import gc
import time
from collections import defaultdict

import torch

from radixlm.runtime import host_to_device
from radixlm.runtime.executor import model_runner
from radixlm.runtime.grammar import on_demand

# Path heads naming a module or class rather than an attribute of the engine.
MODULES = {"runner_module": model_runner, "on_demand_module": on_demand, "OnDemandRows": on_demand.OnDemandRows}

# (label, path from the engine to the object, method); in call order, outer phases first.
PHASES = [
    ("tokenize + build requests", "builder", "build"),
    ("scheduler step", "scheduler", "step"),
    ("  add_request", "scheduler", "add_request"),
    ("  next batch", "scheduler", "get_next_batch_to_run"),
    ("    admit new", "scheduler.admission", "admit_new"),
    ("    mix in running", "scheduler.admission", "mixed_in"),
    ("    update running", "scheduler.admission", "update_running"),
    ("    plan rows", "scheduler.planner", "plan"),
    ("  launch", "scheduler", "launch_batch"),
    ("    model forward (enqueue)", "runner", "forward"),
    ("      graph replay", "runner.graph_runner", "replay"),
    ("      eager model", "runner.model", "forward"),
    ("      host to device", "runner_module", "host_to_device"),
    ("    grammar masks prepare", "scheduler.masks", "prepare"),
    ("    sampler", "scheduler.launcher", "sampler"),
    ("  process results", "scheduler.results", "process_batch_result"),
    ("    grammar resolve", "scheduler.masks", "resolve"),
    ("      top-k to host lists", "OnDemandRows", "host_lists"),
    ("      masked argmax (device)", "on_demand_module", "_masked_argmax"),
    ("        fill masks", "scheduler.grammar_queue.backend", "fill_bitmasks"),
    ("    verify drafts", "scheduler.results", "_process_verified"),
    ("    propose drafts", "scheduler.drafts", "propose"),
    ("    cache finished", "scheduler.tree_cache", "cache_finished"),
]


class PhaseTimer:
    def __init__(self):
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self._undo: list = []
        self._allocator0: dict[str, int] = {}
        self._allocator1: dict[str, int] = {}

    @classmethod
    def attach(cls, engine) -> "PhaseTimer":
        timer = cls()
        for label, path, name in PHASES:
            obj = engine
            for part in path.split("."):
                obj = MODULES[part] if part in MODULES else getattr(obj, part, None)
            if obj is not None:  # (no graph runner on the CPU)
                timer._wrap(obj, name, label, instance=not isinstance(obj, type))
        graphs = engine.runner.graph_runner.graphs if engine.runner.graph_runner is not None else {}
        for graph in graphs.values():  # a graph's first launch uploads it to the device
            timer._wrap_launch(graph)
        timer._allocator0 = _allocator_counts()
        timer._wrap(host_to_device.HostCopy, "get", "  wait for device", instance=False)
        gc.callbacks.append(timer._gc)
        return timer

    def _gc(self, phase: str, info: dict) -> None:
        """Time in the garbage collector (any thread), by generation."""
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            label = f"garbage collection gen {info['generation']}"
            self.seconds[label] += time.perf_counter() - self._gc_start
            self.calls[label] += 1

    def _wrap(self, obj, name: str, label: str, instance: bool) -> None:
        fn = getattr(obj, name)
        calls, seconds, clock = self.calls, self.seconds, time.perf_counter

        def timed(*a, **kw):
            t0 = clock()
            try:
                return fn(*a, **kw)
            finally:
                seconds[label] += clock() - t0
                calls[label] += 1

        own = name in vars(obj)  # an attribute of the object itself (not a method of its class)
        setattr(obj, name, timed)
        self._undo.append((obj, name, fn, own or not instance))

    def _wrap_launch(self, graph) -> None:
        fn, calls, seconds, clock = graph.replay, self.calls, self.seconds, time.perf_counter

        def timed():
            label = "        graph launch" if calls[id(graph)] else "        graph launch (first)"
            calls[id(graph)] += 1
            t0 = clock()
            fn()
            seconds[label] += clock() - t0
            calls[label] += 1

        graph.replay = timed
        self._undo.append((graph, "replay", fn, False))

    def allocator_counts(self) -> dict[str, int]:
        """CUDA caching-allocator events between attach and detach: new segments (cudaMalloc), retries after freeing
        the cache, segments given back (cudaFree)."""
        now = self._allocator1 or _allocator_counts()
        return {k: now[k] - self._allocator0.get(k, 0) for k in now}

    def detach(self) -> None:
        self._allocator1 = _allocator_counts()
        gc.callbacks.remove(self._gc)
        for obj, name, fn, restore in reversed(self._undo):
            if restore:
                setattr(obj, name, fn)
            else:
                delattr(obj, name)  # the class's method shows through again
        self._undo.clear()

    def as_dict(self) -> dict[str, dict]:
        out = {label.strip(): {"calls": self.calls[label], "seconds": self.seconds[label]}
               for label in list(self.calls) if isinstance(label, str) and self.calls[label]}
        return {**out, "cuda allocator": self.allocator_counts()} if self._allocator0 else out

    def table(self, wall_s: float, passes: int, tokens: int) -> str:
        lines = [f"{'phase':32} {'calls':>7} {'total s':>8} {'% wall':>7} {'us/pass':>8} {'us/token':>9}"]
        order = [p[0] for p in PHASES] + [f"garbage collection gen {g}" for g in range(3)]
        order[order.index("      graph replay") + 1 : 0] = ["        graph launch (first)", "        graph launch"]
        order.insert(order.index("  process results") + 1, "  wait for device")
        for label in order:
            if not self.calls[label]:
                continue
            s = self.seconds[label]
            lines.append(f"{label:32} {self.calls[label]:7d} {s:8.3f} {100 * s / wall_s:6.1f}% "
                         f"{1e6 * s / max(passes, 1):8.0f} {1e6 * s / max(tokens, 1):9.1f}")
        if self._allocator0:
            lines.append("cuda allocator: " + ", ".join(f"{k} {v}" for k, v in self.allocator_counts().items()))
        return "\n".join(lines)


def _allocator_counts() -> dict[str, int]:
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {"cudaMalloc": stats.get("segment.all.allocated", 0), "alloc retries": stats.get("num_alloc_retries", 0),
            "cudaFree": stats.get("segment.all.freed", 0)}


def profile_steps(engine) -> cProfile.Profile:
    """cProfile of the scheduler's steps from now on (on the engine's thread, where they run)."""
    prof = cProfile.Profile()
    step = engine.scheduler.step

    def profiled_step():
        prof.enable()
        try:
            return step()
        finally:
            prof.disable()

    engine.scheduler.step = profiled_step
    return prof
