"""The tensor-parallel event loop's per-turn broadcast on two gloo ranks of one host (the CPU stand-in for two GPU
ranks' host side), side by side: torch's broadcast_object_list of the loop's usual message, and Parallel.broadcast_object
of nothing new (None) and of a small object. Microseconds per call, medians of 5 rounds of 200 calls.

    python benchmarks/tp_broadcast_cpu.py
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.runtime.distributed.harness import run_ranks  # noqa: E402


def bench(parallel) -> dict[str, int]:
    import torch.distributed as dist

    src = parallel.tp_rank == 0

    def torch_object_list():
        box = [([], False) if src else None]
        dist.broadcast_object_list(box, src=0)

    calls = {"broadcast_object_list": torch_object_list,
             "broadcast_object(None)": lambda: parallel.broadcast_object(None),
             "broadcast_object(small)": lambda: parallel.broadcast_object((list(range(30)), False) if src else None)}
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(5):
        for name, fn in calls.items():
            for _ in range(20):
                fn()
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            times[name].append((time.perf_counter() - t0) / 200 * 1e6)
    return {k: round(statistics.median(v)) for k, v in times.items()}


if __name__ == "__main__":
    for rank, row in enumerate(run_ranks(2, bench)):
        print(f"rank {rank}: " + ", ".join(f"{k} {v} us" for k, v in row.items()))
