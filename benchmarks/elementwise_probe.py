"""How close the fused element-wise kernels (layers/fused_kernels.py: RMSNorm with the residual add, SiLU-and-mul,
the rotary embedding with the KV store) run to the device's copy bandwidth, on Llama-3.1-8B's shapes, bf16, at the
row counts of a batch-256 decode step, a large decode pass and a prefill pass (issue 20: the element-wise share of
ShareGPT-like's prefill passes). Each kernel runs at its serving launch parameters and at others (warps, block),
every figure a CUDA-graph replay over distinct input copies (no L2 hits between calls), beside a device copy of the
same bytes (read + written).

    python benchmarks/elementwise_probe.py --out $OUT/elementwise_probe.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import graph_us, write_cells  # noqa: E402
from radixlm.runtime.layers import fused_kernels as fk  # noqa: E402

HIDDEN, INTER, Q_HEADS, KV_HEADS, HEAD = 4096, 14336, 32, 8, 128


def copies_for(nbytes: int) -> int:
    return max(2, min(16, -(-400_000_000 // max(nbytes, 1))))


def rmsnorm_cases(n: int, dev, dt):
    nbytes = 4 * n * HIDDEN * 2
    c = copies_for(nbytes)
    xs = [torch.randn(n, HIDDEN, device=dev, dtype=dt) for _ in range(c)]
    rs = [torch.randn(n, HIDDEN, device=dev, dtype=dt) for _ in range(c)]
    w = torch.randn(HIDDEN, device=dev, dtype=dt)
    out = [torch.empty_like(x) for x in xs]
    res = [torch.empty_like(x) for x in xs]

    def launch(warps):
        def fn(i):
            fk._rmsnorm_kernel[(n,)](xs[i], rs[i], w, out[i], res[i], HIDDEN, HIDDEN, HIDDEN, HIDDEN, HIDDEN, 1e-5,
                                     HAS_RESIDUAL=True, BLOCK=HIDDEN, num_warps=warps)
        return fn
    serving = 4 if HIDDEN <= 2048 else 8
    return nbytes, c, {f"warps {w}" + (" (serving)" if w == serving else ""): launch(w) for w in (4, 8, 16)}


def silu_cases(n: int, dev, dt):
    nbytes = 3 * n * INTER * 2
    c = copies_for(nbytes)
    xs = [torch.randn(n, 2 * INTER, device=dev, dtype=dt) for _ in range(c)]
    out = [torch.empty(n, INTER, device=dev, dtype=dt) for _ in range(c)]

    def launch(block, warps):
        def fn(i):
            fk._silu_and_mul_kernel[(n, triton.cdiv(INTER, block))](xs[i], out[i], 2 * INTER, INTER, INTER,
                                                                   BLOCK=block, num_warps=warps)
        return fn
    return nbytes, c, {f"block {b} warps {w}" + (" (serving)" if (b, w) == (1024, 4) else ""): launch(b, w)
                       for b, w in ((1024, 4), (1024, 8), (2048, 4), (2048, 8), (4096, 8), (512, 4))}


def rotary_cases(n: int, dev, dt):
    qk = (Q_HEADS + KV_HEADS) * HEAD
    nbytes = n * (2 * qk + 3 * KV_HEADS * HEAD) * 2 + n * HEAD * 4
    c = copies_for(nbytes)
    slots = n * c
    qkv = [torch.randn(n, qk + KV_HEADS * HEAD, device=dev, dtype=dt) for _ in range(c)]
    pos = torch.randint(0, 4096, (n,), device=dev)
    locs = [torch.randperm(slots, device=dev)[:n] for _ in range(c)]
    cos_sin = torch.randn(4096, HEAD, device=dev, dtype=torch.float32)
    k_buf = torch.empty(slots, KV_HEADS, HEAD, device=dev, dtype=dt)
    v_buf = torch.empty_like(k_buf)
    half = HEAD // 2

    def launch(block_h, warps):
        def fn(i):
            q, k, v = qkv[i].split([Q_HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
            fk._rotary_kernel[(n,)](pos, cos_sin, q, k, v, locs[i], k_buf, v_buf, q.stride(0), k.stride(0), v.stride(0),
                                    cos_sin.stride(0), k_buf.stride(0), v_buf.stride(0), Q_HEADS, KV_HEADS,
                                    HEAD_SIZE=HEAD, HALF=half, BLOCK_HALF=half, BLOCK_H=block_h, STORE=True,
                                    num_warps=warps, enable_fp_fusion=False)
        return fn
    serving = min(triton.next_power_of_2(Q_HEADS), 4096 // half)
    return nbytes, c, {f"block_h {b} warps {w}" + (" (serving)" if (b, w) == (serving, 4) else ""): launch(b, w)
                       for b, w in ((serving, 4), (serving, 8), (8, 4), (16, 4), (16, 2))}


def copy_us(nbytes: int, dev) -> float:
    c = copies_for(nbytes)
    src = [torch.empty(nbytes // 4, device=dev, dtype=torch.bfloat16) for _ in range(c)]
    dst = [torch.empty_like(s) for s in src]
    return graph_us(lambda i: dst[i].copy_(src[i]), c)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", nargs="+", type=int, default=[256, 1024, 8192])
    p.add_argument("--out", default="elementwise_probe.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    dev, dt = "cuda", torch.bfloat16
    cells = []
    for n in args.rows:
        for op, build in (("add_rmsnorm", rmsnorm_cases), ("silu_and_mul", silu_cases), ("rotary_store", rotary_cases)):
            nbytes, c, variants = build(n, dev, dt)
            base = copy_us(nbytes, dev)
            print(f"{op:13s} rows {n:5d}: {nbytes / 1e6:8.1f} MB, copy of the same bytes {base:8.1f} us "
                  f"({nbytes / base / 1e6:.2f} TB/s)")
            for name, fn in variants.items():
                us = graph_us(fn, c)
                cells.append({"op": op, "rows": n, "variant": name, "bytes": nbytes, "us": us, "copy_us": base,
                              "tb_s": nbytes / us / 1e6, "of_copy": base / us})
                print(f"    {name:28s} {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s  {base / us:5.2f} of copy")
            write_cells(args.out, "elementwise_probe", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
