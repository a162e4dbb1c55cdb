"""Programmatic dependent launch (PDL) at batch 1 (issue 20: the batch-1 step loses ~3 us a GEMM to ramp and tail,
~0.4 ms a step). A CUDA-graph replay of the batch-1 decode GEMM chain of Llama-3.1-8B (32 layers of qkv -> o ->
gate_up -> down, each reading the previous output; one skinny-kernel variant), with and without PDL: launched with
PDL, a kernel's programs start while the previous kernel's last ones run, read their first weight tile, and wait
(gdc_wait) before they read the previous output; each kernel lets the next one start as soon as all its programs
have started (gdc_launch_dependents). Optionally a small element-wise kernel between the GEMMs (as norms, rotary
and the activation sit between them in a layer), PDL-aware too.

    python benchmarks/pdl_probe.py --out $OUT/pdl_probe.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older Triton: the probe reports it
    gdc_launch_dependents = gdc_wait = None

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]


@triton.jit
def _gemv(X, W, Y, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
          PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    if PDL:
        gdc_launch_dependents()
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    w_ptrs = W + offs_n[:, None] * stride_wn + offs_k[None, :]
    if PREFETCH:
        w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0).to(tl.float32)  # weights: no dependency
    if PDL:
        gdc_wait()
    if PREFETCH:
        x = tl.load(X + offs_k).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
        start = BLOCK_K
    else:
        start = 0
    for k0 in range(start, K, BLOCK_K):
        k = k0 + offs_k
        w = tl.load(W + offs_n[:, None] * stride_wn + k[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
        x = tl.load(X + k).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(Y + offs_n, acc.to(Y.dtype.element_ty), mask=n_mask)


@triton.jit
def _scale(X, Y, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    tl.store(Y + offs, tl.load(X + offs, mask=m) * 0.5, mask=m)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--out", default="pdl_probe.json")
    args = p.parse_args()
    res = {"benchmark": "pdl_probe", "gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
           "gdc": gdc_wait is not None, "cells": []}
    if gdc_wait is None:
        print("this Triton has no gdc_wait: nothing to measure")
        Path(args.out).write_text(json.dumps(res, indent=1))
        return
    dev = "cuda"
    ws = [[torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5 for _, n, k in SHAPES]
          for _ in range(args.layers)]
    bufs = {name: torch.randn(max(n, k), device=dev, dtype=torch.bfloat16) for name, n, k in SHAPES}
    tmp = torch.empty(28672, device=dev, dtype=torch.bfloat16)
    x0 = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    weight_bytes = sum(n * k * 2 for _, n, k in SHAPES) * args.layers

    def chain(pdl: bool, prefetch: bool, between: bool, block_n: int, block_k: int, warps: int):
        x = x0
        for layer in ws:
            for (name, n, k), w in zip(SHAPES, layer):
                if between:
                    _scale[(triton.cdiv(k, 1024),)](x, tmp, k, BLOCK=1024, PDL=pdl, launch_pdl=pdl)
                    x = tmp
                y = bufs[name]
                _gemv[(triton.cdiv(n, block_n),)](x, w, y, n, k, w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
                                                  PDL=pdl, PREFETCH=prefetch, num_warps=warps, num_stages=3,
                                                  launch_pdl=pdl)
                x = y

    for between in (False, True):
        for block_n, block_k, warps in ((8, 512, 4), (16, 512, 4), (16, 256, 4)):
            cell = {"between": between, "block_n": block_n, "block_k": block_k, "warps": warps}
            ref = None
            for name, pdl, prefetch in (("plain", False, False), ("pdl", True, False), ("pdl_prefetch", True, True),
                                        ("prefetch", False, True)):
                try:
                    fn = lambda: chain(pdl, prefetch, between, block_n, block_k, warps)  # noqa: E731
                    fn()
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        fn()
                    g.replay()
                    torch.cuda.synchronize()
                    out = bufs["down"][:4096].float().clone()
                    ref = out if name == "plain" else ref
                    ms = triton.testing.do_bench(g.replay, warmup=20, rep=200)
                    cell[name] = {"ms": ms, "tb_s": weight_bytes / ms / 1e9,
                                  "max_abs_diff_vs_plain": (out - ref).abs().max().item()}
                except Exception as exc:  # noqa: BLE001 - reported
                    cell[name] = {"error": repr(exc)[:300]}
            res["cells"].append(cell)
            print(json.dumps(cell), flush=True)
            Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - t0:.0f} s")
