"""Triton kernel builds in parallel for start-up (issue 20: a cold start-up built ~40 kernels one after another, each
0.1-0.4 s, plus a C launcher per kernel signature at its first launch).

A discovery run of the warm-up passes skips every launch whose kernel is not built yet and hands its build to a
thread pool: Triton's own preload of the launch's specialization (the data its JIT cache hook receives), then the
kernel's module load and launcher build. The warm-up then runs for real and finds every kernel in memory. The builds
spend most of their time outside the GIL (MLIR passes, ptxas, the C compiler): seven builds took 1.14 s one after
another and 0.43 s in 8 threads on the H100 machine (benchmarks/results/startup/parallel_build_probe_h100.json; the
probe is retired, see benchmarks/RETIRED.md). Imported only on CUDA."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import torch

logger = logging.getLogger(__name__)

BUILD_THREADS = 8


def _build(fn, specialization_data: str) -> None:
    kernel = fn.preload(specialization_data)
    init = getattr(kernel, "_init_handles", None)
    if init is not None:  # (private in Triton 3.x) else the first launch loads it and builds its launcher
        init()


class ParallelBuilds:
    """Builds kernels in a thread pool: those a caller submits (submit()) and those a discovery run finds unbuilt
    (discover()); finish() waits for them all.

    NOTE invariant: inside discover(), a skipped launch leaves its outputs unwritten, so what runs there must not let
    a value a Triton kernel computes steer the host or index memory. A dense model's warm-up passes qualify (every
    index and length comes from the host) but for the chunked decode's work list (decode_work.py: its table indexes
    the decode kernels' reads); MoE layers do not (their routing kernels compute the offsets that later kernels and
    copies index with), nor do autotuned kernels (their timing would time nothing): pass those in `inline`, to build
    as before."""

    def __init__(self, device: torch.device | str, inline: tuple = (), threads: int = BUILD_THREADS):
        self.inline = set(inline)
        index = torch.device(device).index
        if torch.cuda.is_available():  # the builds run on the engine's device (a tensor-parallel rank's own)
            index = torch.cuda.current_device() if index is None else index
            init = dict(initializer=torch.cuda.set_device, initargs=(index,))
        else:
            init = {}  # (the unit tests of the discovery rule, on a CPU)
        self._pool = ThreadPoolExecutor(max(1, min(threads, os.cpu_count() or 1)), thread_name_prefix="kernel-build",
                                        **init)
        self._builds: dict[str, Future] = {}

    def submit(self, build: Callable[..., object], *args) -> None:
        """build(*args) in the pool: a kernel's JITFunction.warmup, say (it builds without launching)."""
        self._builds[f"{getattr(build, '__qualname__', 'build')} #{len(self._builds)}"] = self._pool.submit(build, *args)

    @contextmanager
    def discover(self) -> Iterator[ParallelBuilds]:
        from triton import knobs

        prev = knobs.runtime.jit_cache_hook

        def hook(**kw) -> bool:
            if prev is not None and prev(**kw):
                return True
            info = kw.get("fn")
            fn = getattr(info, "jit_function", None)
            data = (kw.get("compile") or {}).get("specialization_data")
            if kw.get("is_manual_warmup") or fn is None or data is None or fn in self.inline:
                return False  # our own builds (preload is a warm-up), and what must build inline
            key = f"{getattr(info, 'module', '?')}.{getattr(info, 'name', '?')}:{kw.get('key')}"
            if key not in self._builds:
                self._builds[key] = self._pool.submit(_build, fn, data)
            return True

        knobs.runtime.jit_cache_hook = hook
        try:
            yield self
        finally:
            knobs.runtime.jit_cache_hook = prev

    def finish(self) -> int:
        """Waits for the builds; returns how many succeeded. One that failed is left to its launch (built there)."""
        done = 0
        for key, future in self._builds.items():
            try:
                future.result()
                done += 1
            except Exception as e:  # noqa: BLE001 - the real launch builds it inline (and raises if it must)
                logger.warning("parallel build of %s failed (%r): left to its launch", key.split(":")[0], e)
        self._pool.shutdown()
        return done
