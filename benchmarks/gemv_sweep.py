"""The batch-1 decode GEMMs alone (issue 20: the decode step at batch 1, 1.19x its weight-read floor): cuBLAS against
the skinny Triton kernel (layers/skinny_gemm.py) at every tile config of a grid, and against a split-K form of it
(programs over (N block, K part) add float32 partials atomically; a zero fill before and a cast after), on
Llama-3.1-8B's shapes, bf16, one row.

Every figure is a CUDA-graph replay of the GEMM over COPIES distinct weights in turn (as a model's layers: no L2
hits, no launch overhead), divided by COPIES; the weight-read bandwidth follows.

    python benchmarks/gemv_sweep.py --out $OUT/gemv_sweep.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixlm.runtime.layers.skinny_gemm import _skinny_kernel  # noqa: E402

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336),
          "lm_head": (128256, 4096)}


@triton.jit
def _splitk_kernel(X, W, Y32, N, K, stride_wn, K_PART: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    part = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(part * K_PART, tl.minimum(part * K_PART + K_PART, K), BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(W + offs_n[:, None] * stride_wn + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(X + k, mask=k_mask, other=0.0)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.atomic_add(Y32 + offs_n, acc, mask=n_mask, sem="relaxed")


def within_budget(items, t0: float, budget_s: float):
    """items, until budget_s seconds since t0 are spent (a probe's device call must end inside its limit)."""
    for item in items:
        if time.perf_counter() - t0 > budget_s:
            print("budget spent: stopping", flush=True)
            return
        yield item


def write_cells(path: str, benchmark: str, cells: list) -> None:
    """A kernel probe's results so far (every probe rewrites its file after each cell: a stopped run keeps them)."""
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--budget-s", type=float, default=240)
    p.add_argument("--out", default="gemv_sweep.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    configs = list(itertools.product([4, 8, 16, 32], [256, 512, 1024], [4, 8], [2, 3, 4]))
    splitk = list(itertools.product([2, 4, 8], [8, 16, 32], [512]))
    cells = []
    for name in args.shapes:
        n, k = SHAPES[name]
        ws = weight_copies(n, k)
        copies = len(ws)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ys = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        ref = F.linear(x, ws[0])
        gbytes = n * k * 2 / 1e9
        cublas = graph_us(lambda i: torch.matmul(x, ws[i].t(), out=ys[i]), copies)
        cell = {"shape": name, "n": n, "k": k, "copies": copies, "cublas_us": cublas,
                "cublas_tb_s": gbytes / cublas * 1e3, "skinny": [], "splitk": []}
        print(f"{name:13s}: cuBLAS {cublas:7.1f} us {cell['cublas_tb_s']:.2f} TB/s (floor at 3.0 TB/s "
              f"{gbytes / 3.0 * 1e3:.1f} us)", flush=True)
        for bn, bk, warps, stages in configs:
            if time.perf_counter() - t0 > args.budget_s:
                break

            def run(i, bn=bn, bk=bk, warps=warps, stages=stages):
                _skinny_kernel.fn[(triton.cdiv(n, bn),)](
                    x, ws[i], ws[i], ys[i], n, k, x.stride(0), ws[i].stride(0), ys[i].stride(0), M=1, HAS_BIAS=False,
                    BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
            try:
                run(0)
                diff = (ys[0].float() - ref.float()).abs().max().item()
                us = graph_us(run, copies)
            except Exception as exc:
                cell["skinny"].append({"block_n": bn, "block_k": bk, "warps": warps, "stages": stages,
                                       "error": repr(exc)[:160]})
                continue
            cell["skinny"].append({"block_n": bn, "block_k": bk, "warps": warps, "stages": stages, "us": us,
                                   "tb_s": gbytes / us * 1e3, "max_abs_diff": diff})
        y32 = [torch.zeros(n, device="cuda", dtype=torch.float32) for _ in range(copies)]
        for parts, bn, bk in splitk:
            k_part = -(-k // parts)
            k_part = -(-k_part // bk) * bk

            def run_split(i, bn=bn, bk=bk, parts=parts, k_part=k_part):
                y32[i].zero_()
                _splitk_kernel[(triton.cdiv(n, bn), parts)](x, ws[i], y32[i], n, k, ws[i].stride(0), K_PART=k_part,
                                                            BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=3)
                ys[i].copy_(y32[i][None, :])
            try:
                run_split(0)
                diff = (ys[0].float() - ref.float()).abs().max().item()
                us = graph_us(run_split, copies)
            except Exception as exc:
                cell["splitk"].append({"parts": parts, "block_n": bn, "error": repr(exc)[:160]})
                continue
            cell["splitk"].append({"parts": parts, "block_n": bn, "block_k": bk, "us": us, "tb_s": gbytes / us * 1e3,
                                   "max_abs_diff": diff})
        for kind in ("skinny", "splitk"):
            best = sorted((c for c in cell[kind] if "us" in c), key=lambda c: c["us"])[:3]
            for c in best:
                shown = {key: v for key, v in c.items() if key not in ("us", "tb_s", "max_abs_diff")}
                print(f"    {kind:6s} {shown}: {c['us']:7.1f} us {c['tb_s']:.2f} TB/s x{cublas / c['us']:.3f} "
                      f"(diff {c['max_abs_diff']:.1e})", flush=True)
        cells.append(cell)
        del ws, ys, y32
        torch.cuda.empty_cache()
        write_cells(args.out, "gemv_sweep", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
