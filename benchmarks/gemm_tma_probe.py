"""Decode GEMMs at 128-512 rows with Hopper's tensor-memory loads (issue 20: at batch 256 cuBLAS's GEMMs take ~7.4 ms
of a ~15.6 ms step; `gemm_sweep.py`'s pointer-load Triton GEMM ran at 0.35-0.87x cuBLAS). A Triton GEMM y = x @ W.T
(W row-major (N, K), as the model holds it) whose tiles are read through TMA descriptors made on the host, in three
forms: one program per output tile, persistent programs (one per SM) walking the tiles, and persistent with warp
specialization (the loads in their own warps). Within a column of tiles the row tiles are adjacent, so programs that
run together share W's tile (read once from HBM, then from L2).

Every figure is a CUDA-graph replay over COPIES distinct weights in turn (no L2 hits, no launch overhead), divided by
COPIES, against cuBLAS (F.linear's matmul) timed the same way; each config is checked against cuBLAS's output.

    python benchmarks/gemm_tma_probe.py --out $OUT/gemm_tma_probe.json
    TRITON_INTERPRET=1 python benchmarks/gemm_tma_probe.py --check-cpu     # the kernel's arithmetic, on the CPU
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_sweep import add_triton_row, print_best, probe_args, shape_cells  # noqa: E402


@triton.jit
def _tile(x_desc, w_desc, y_desc, tile, num_m, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr):
    off_m = (tile % num_m) * BLOCK_M
    off_n = (tile // num_m) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = x_desc.load([off_m, k0])
        w = w_desc.load([off_n, k0])
        acc = tl.dot(x, w.T, acc)
    y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


@triton.jit
def _tma_gemm(x_desc, w_desc, y_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    tiles = num_m * tl.cdiv(N, BLOCK_N)
    if WARP_SPECIALIZE:
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), warp_specialize=True):
            _tile(x_desc, w_desc, y_desc, tile, num_m, K, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
            _tile(x_desc, w_desc, y_desc, tile, num_m, K, BLOCK_M, BLOCK_N, BLOCK_K)


def launch(x_desc, w_desc, y_desc, m, n, k, cfg: dict, num_sms: int) -> None:
    bm, bn = cfg["block_m"], cfg["block_n"]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = (min(tiles, num_sms) if cfg["form"] != "tile" else tiles,)
    _tma_gemm[grid](x_desc, w_desc, y_desc, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg["block_k"],
                    WARP_SPECIALIZE=cfg["form"] == "persistent_ws", num_warps=cfg["warps"],
                    num_stages=cfg["stages"])


def descriptors(x, w, y, cfg: dict):
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    return (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
            TensorDescriptor.from_tensor(y, [bm, bn]))


def configs() -> list[dict]:
    tiles = [(64, 128, 4), (64, 128, 8), (128, 128, 4), (128, 128, 8), (64, 256, 8), (128, 256, 8)]
    out = []
    for (bm, bn, warps), stages, form in itertools.product(tiles, [3, 4], ["tile", "persistent", "persistent_ws"]):
        out.append({"block_m": bm, "block_n": bn, "block_k": 64, "warps": warps, "stages": stages, "form": form})
    return out


def check_cpu() -> None:
    """Under TRITON_INTERPRET=1: every form's result equals x @ W.T in float32 at ragged sizes."""
    g = torch.Generator().manual_seed(0)
    for m, n, k in [(5, 48, 64), (70, 40, 96)]:
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        for form in ("tile", "persistent"):
            cfg = {"block_m": 32, "block_n": 32, "block_k": 32, "warps": 4, "stages": 2, "form": form}
            y = torch.empty(m, n)
            launch(*descriptors(x, w, y, cfg), m, n, k, cfg, num_sms=3)
            torch.testing.assert_close(y, x @ w.T, atol=1e-4, rtol=1e-4)
    print("gemm_tma_probe: interpreter check passed")


def main() -> None:
    args = probe_args([256, 128], 200, "gemm_tma_probe.json", check_cpu)
    t0 = time.perf_counter()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    cells = []
    pairs = ((name, m) for m, name in itertools.product(args.rows, args.shapes))
    for cell, x, ws, ys, ref in shape_cells(pairs, t0, args.budget_s, cells, args.out, "gemm_tma_probe"):
        m, n, k = cell["m"], cell["n"], cell["k"]
        for cfg in configs():  # (descriptors are built on the host at capture: the replays time the kernel alone)
            add_triton_row(cell, dict(cfg), lambda i, cfg=cfg: launch(*descriptors(x, ws[i], ys[i], cfg), m, n, k, cfg,
                                                                       num_sms), ref, ys[0])
        errors = sum("error" in r for r in cell["triton"])
        print_best(cell, lambda r: f"{r['form']:13s} M{r['block_m']} N{r['block_n']} s{r['stages']} w{r['warps']}",
                   f", {errors} configs failed")
        if errors:
            print("    e.g. " + next(r["error"] for r in cell["triton"] if "error" in r), flush=True)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
