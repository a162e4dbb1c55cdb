"""Device timing for kernel measurements: Llama-3.1-8B's GEMM weight shapes, CUDA-graph replays over distinct weight
copies (as a model's layers: no L2 hits, no launch overhead), a time budget for a device call, and the probes'
incremental result file."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336),
          "lm_head": (128256, 4096)}


def within_budget(items, t0: float, budget_s: float):
    """items, until budget_s seconds since t0 are spent (a probe's device call must end inside its limit)."""
    for item in items:
        if time.perf_counter() - t0 > budget_s:
            print("budget spent: stopping", flush=True)
            return
        yield item


def write_cells(path: str, benchmark: str, cells: list) -> None:
    """A kernel probe's results so far (every probe rewrites its file after each cell: a stopped run keeps them)."""
    import triton

    Path(path).write_text(json.dumps({"benchmark": benchmark, "gpu": torch.cuda.get_device_name(),
                                      "torch": torch.__version__, "triton": triton.__version__, "cells": cells},
                                     indent=1))


def weight_copies(n: int, k: int, scale: float = 0.02, dtype=torch.bfloat16, device="cuda") -> list[torch.Tensor]:
    """Distinct random (n, k) weights, enough of them (2-16, ~600 MB) that a graph replaying one GEMM per copy reads
    each from HBM, as a model's forward does (no L2 hits)."""
    copies = max(2, min(16, -(-600_000_000 // (n * k * 2))))
    return [torch.randn(n, k, device=device, dtype=dtype) * scale for _ in range(copies)]


def graph_us(fn, copies: int) -> float:
    """Microseconds per call: a graph of `copies` calls (fn(i) uses weight copy i) replayed."""
    import triton.testing

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(copies):
            fn(i)
    ms = triton.testing.do_bench(g.replay, warmup=10, rep=60)
    return ms * 1e3 / copies


def quick_us(fn, copies: int, reps: int = 5) -> float:
    """A cheaper graph timing for a wide search: one capture, two warm replays, `reps` timed ones."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(copies):
            fn(i)
    for _ in range(2):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / copies


def wall_us(fn, copies: int) -> float:
    """A dry run's stand-in for graph_us (on the CPU, under TRITON_INTERPRET=1): one call per copy, wall clock."""
    t = time.perf_counter()
    for i in range(copies):
        fn(i)
    return (time.perf_counter() - t) * 1e6 / copies


def tree() -> str | None:
    """The commit measured (results/INDEX.md's tree column), where the tree is a git checkout."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parents[2]).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
