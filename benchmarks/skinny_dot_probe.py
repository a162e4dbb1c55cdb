"""Decode GEMMs at 4-64 rows (issue 20: batch 8-64 steps and ShareGPT-like's ~600 tail steps under 64 requests):
a skinny kernel that reduces on the tensor cores, against cuBLAS, Llama-3.1-8B's shapes, bf16.

At 8-48 rows cuBLAS's GEMMs run 15-20% over their weight reads (qkv 21.9 us at 8 rows against 16.8; all four 172.8
us a layer against 145.4), where the skinny kernel (layers/skinny_gemm.py) runs one row 8% over them (157.6 us);
a plain Triton GEMM with one 16- or 32-row M tile and 32-256-column N tiles gained 0-12% over cuBLAS
(`kernels_h100/gemm_sweep_small.json`). The kernel swept here (layers/skinny_mma.py since this probe's run, 2026-11-27,
`kernels_h100/skinny_dot_probe.json`) keeps the skinny kernel's shape of work, many programs each streaming a narrow
[BLOCK_N, K] band of W, and swaps the operands of the product: acc[BLOCK_N, BLOCK_M] += W_tile @ x_tile^T, so the
band's BLOCK_N (16-64) columns are the MMA's M side and the few rows its N side.

Every figure is a CUDA-graph replay over distinct weight copies (no L2 hits), as in gemv_sweep.py.

    python benchmarks/skinny_dot_probe.py --out $OUT/skinny_dot_probe.json        # on a GPU, ~3 min
    python benchmarks/skinny_dot_probe.py --rows 48 64 --out $OUT/skinny_dot_64.json   # BLOCK_M 64 (33-64 rows)
    TRITON_INTERPRET=1 python benchmarks/skinny_dot_probe.py --check-cpu           # the kernel's sums, on the CPU
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_sweep import add_triton_row, print_best, probe_args, shape_cells  # noqa: E402
from radixlm.runtime.layers.skinny_mma import _skinny_mma_kernel  # noqa: E402

LAYER_SHAPES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
LAYERS = 32


def skinny_dot(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, block_n: int, block_k: int, warps: int,
               stages: int) -> torch.Tensor:
    """y = x @ w.T; x (M, K) with M <= 64, w (N, K), both K-contiguous: the serving kernel (layers/skinny_mma.py) at
    the given config."""
    m, k = x.shape
    n = w.shape[0]
    _skinny_mma_kernel[(triton.cdiv(n, block_n),)](
        x, w, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0), HAS_BIAS=False, EVEN_K=k % block_k == 0,
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        num_stages=stages)
    return y


# (BLOCK_N, BLOCK_K, warps, stages) that fit the stages' W and x tiles in shared memory at a BLOCK_M (16, 32, 64);
# BLOCK_K 128 only at 64 rows (the 2026-11-27 run swept 256 and 512 at every row count; none fit well at 64 rows).
def configs(block_m: int) -> list[tuple[int, int, int, int]]:
    block_ks = [128, 256] if block_m >= 64 else [256, 512]
    return [c for c in itertools.product([16, 32, 64], block_ks, [2, 4], [3, 4])
            if (c[0] + block_m) * c[1] * 2 * c[3] <= 220_000]


def check_cpu() -> None:
    for (m, n, k), (bn, bk) in itertools.product([(3, 40, 96), (17, 33, 256)], [(16, 32), (32, 64)]):
        x, w = torch.randn(m, k), torch.randn(n, k)
        y = skinny_dot(x, w, torch.empty(m, n), bn, bk, 1, 1)
        err = (y - F.linear(x, w)).abs().max().item()
        print(f"M={m} N={n} K={k} BLOCK_N={bn} BLOCK_K={bk}: max |diff| {err:.2e}")
        assert err < 1e-3


def main() -> None:
    args = probe_args([4, 8, 16, 32, 48, 64], 240, "skinny_dot_probe.json", check_cpu)
    t0 = time.perf_counter()
    cells = []
    pairs = ((name, m) for m, name in itertools.product(args.rows, args.shapes))
    for cell, x, ws, ys, ref in shape_cells(pairs, t0, args.budget_s, cells, args.out, "skinny_dot_probe"):
        for bn, bk, warps, stages in configs(max(16, triton.next_power_of_2(cell["m"]))):
            add_triton_row(cell, {"block_n": bn, "block_k": bk, "warps": warps, "stages": stages},
                           lambda i: skinny_dot(x, ws[i], ys[i], bn, bk, warps, stages), ref, ys[0])
        print_best(cell, lambda r: f"N{r['block_n']:<3d} K{r['block_k']:<4d} w{r['warps']} s{r['stages']}")
    # A decode step's four GEMMs a layer, x LAYERS: cuBLAS against the best of cuBLAS and this kernel per shape.
    for m in args.rows:
        row = [c for c in cells if c["m"] == m]
        if {c["shape"] for c in row} != set(LAYER_SHAPES):
            continue
        blas = sum(c["cublas_us"] for c in row)
        best = sum(min([c["cublas_us"]] + [r["us"] for r in c["triton"] if "us" in r]) for c in row)
        print(f"M={m:3d}: four GEMMs a layer cuBLAS {blas:6.1f} us, best {best:6.1f} us: "
              f"{(blas - best) * LAYERS / 1000:.2f} ms a step")
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
