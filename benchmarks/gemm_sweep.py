"""The decode GEMMs at mid batch alone (issue 20: at batch 256 cuBLAS's GEMMs take 7.4 ms of a 15.8 ms step, ~1.4x
what the weight reads or the tensor cores need): cuBLAS (F.linear) against a Triton GEMM (y = x @ W.T, W row-major
(N, K) as the model holds it; tiles grouped along M so that programs that run together share W's tiles) at every
tile config of a grid, Llama-3.1-8B's shapes, bf16, M = 64-512 rows (and 8-48: one 16- or 32-row tile, `--rows 8 16 32 48`).

Every figure is a CUDA-graph replay over COPIES distinct weights in turn (no L2 hits, no launch overhead), divided by
COPIES; TFLOP/s and the weight-read bandwidth follow.

    python benchmarks/gemm_sweep.py --out $OUT/gemm_sweep.json
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import SHAPES, graph_us, weight_copies, within_budget, write_cells  # noqa: E402


@triton.jit
def _gemm_kernel(X, W, Y, M, N, K, stride_xm, stride_wn, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_N: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # Programs run a group of GROUP_N column tiles for every M tile together: each W tile is read by all its M tiles
    # while it is in L2.
    per_group = GROUP_N * num_m
    group = pid // per_group
    first_n = group * GROUP_N
    size_n = tl.minimum(num_n - first_n, GROUP_N)
    pid_m = (pid % per_group) // size_n
    pid_n = first_n + (pid % per_group) % size_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = W + offs_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=offs_m[:, None] < M, other=0.0)
        w = tl.load(w_ptrs, mask=offs_n[:, None] < N, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def cublas_cell(name: str, x: torch.Tensor, ws: list[torch.Tensor], ys: list[torch.Tensor]) -> dict:
    """A probe's cell for one shape and row count, with cuBLAS's graph-replayed time (out= ys[i]) as the baseline;
    the probe appends its Triton rows to cell["triton"]."""
    (m, k), n = x.shape, ws[0].shape[0]
    us = graph_us(lambda i: torch.matmul(x, ws[i].t(), out=ys[i]), len(ws))
    return {"shape": name, "m": m, "n": n, "k": k, "copies": len(ws), "cublas_us": us,
            "cublas_tflops": 2 * m * n * k / us / 1e6, "weight_read_us_at_3tbps": n * k * 2 / 3e12 * 1e6, "triton": []}


def probe_args(rows: list[int], budget_s: float, out: str, check_cpu=None) -> argparse.Namespace:
    """The GEMM probes' command line: --shapes (the four of a layer), --rows, --budget-s, --out; with check_cpu, also
    --check-cpu, which runs it here (under TRITON_INTERPRET=1) and exits."""
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    p.add_argument("--rows", type=int, nargs="+", default=rows)
    p.add_argument("--budget-s", type=float, default=budget_s)
    p.add_argument("--out", default=out)
    if check_cpu is not None:
        p.add_argument("--check-cpu", action="store_true")
    args = p.parse_args()
    if check_cpu is not None and args.check_cpu:
        check_cpu()
        sys.exit(0)
    return args


def shape_cells(pairs, t0: float, budget_s: float, cells: list, out: str, benchmark: str):
    """The GEMM probes' loop over (shape name, rows) pairs until budget_s is spent. Yields (cell, x, ws, ys, ref): the
    cuBLAS-timed cell (cublas_cell), the input, distinct weight copies, their outputs and F.linear's reference, for the
    probe to add its Triton rows to; then appends the cell to `cells`, rewrites `out` and frees the copies."""
    for name, m in within_budget(pairs, t0, budget_s):
        n, k = SHAPES[name]
        ws = weight_copies(n, k)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ys = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in ws]
        cell = cublas_cell(name, x, ws, ys)
        yield cell, x, ws, ys, F.linear(x, ws[0])
        cells.append(cell)
        write_cells(out, benchmark, cells)
        del ws, ys
        torch.cuda.empty_cache()


def add_triton_row(cell: dict, row: dict, run, ref: torch.Tensor, y: torch.Tensor) -> None:
    """Times run(i) (a Triton GEMM into ys[i] over weight copy i) by graph replay and appends row to cell["triton"]
    with its time, its speed against cuBLAS and its largest difference from ref (y: run(0)'s output); a config
    this Triton or GPU does not build gets its error instead."""
    try:
        run(0)
        row["max_abs_diff"] = (y.float() - ref.float()).abs().max().item()
        row["us"] = graph_us(run, cell["copies"])
        row["vs_cublas"] = cell["cublas_us"] / row["us"]
    except Exception as exc:
        row["error"] = repr(exc)[:200]
    cell["triton"].append(row)


def print_best(cell: dict, describe, note: str = "") -> None:
    """cuBLAS's line, then the 3 fastest Triton rows, each named by describe(row)."""
    print(f"{cell['shape']:13s} M={cell['m']:4d}: cuBLAS {cell['cublas_us']:7.1f} us ({cell['cublas_tflops']:.0f} "
          f"TFLOP/s, weights alone {cell['weight_read_us_at_3tbps']:.1f} us){note}", flush=True)
    for r in sorted((r for r in cell["triton"] if "us" in r), key=lambda r: r["us"])[:3]:
        print(f"    {describe(r)}: {r['us']:7.1f} us x{r['vs_cublas']:.3f} (diff {r['max_abs_diff']:.1e})", flush=True)


def main() -> None:
    args = probe_args([64, 128, 256, 512], 300, "gemm_sweep.json")
    t0 = time.perf_counter()
    configs = [c for c in itertools.product([64, 128], [64, 128, 256], [64], [3, 4, 5], [4, 8], [8])
               if not (c[0] == 128 and c[1] == 256 and c[3] > 3) and not (c[1] == 256 and c[4] == 4)]
    # Under 64 rows (the decode tail of ShareGPT-like): one M tile of 16 or 32 rows, the weight stream pipelined.
    small = list(itertools.product([32, 64, 128, 256], [64, 128, 256], [3, 4, 6], [4]))
    cells = []
    for cell, x, ws, ys, ref in shape_cells(itertools.product(args.shapes, args.rows), t0, args.budget_s, cells,
                                            args.out, "gemm_sweep"):
        m, n, k = cell["m"], cell["n"], cell["k"]
        if m < 64:
            bm = max(16, triton.next_power_of_2(m))
            configs_m = [(bm, bn, bk, st, w, 1) for bn, bk, st, w in small if bn * bk <= 128 * 128 or st <= 4]
        else:
            configs_m = configs
        for bm, bn, bk, stages, warps, group in configs_m:
            def run(i, bm=bm, bn=bn, bk=bk, stages=stages, warps=warps, group=group):
                grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
                _gemm_kernel[grid](x, ws[i], ys[i], m, n, k, x.stride(0), ws[i].stride(0), ys[i].stride(0),
                                   BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_N=group, num_warps=warps,
                                   num_stages=stages)
            add_triton_row(cell, {"block_m": bm, "block_n": bn, "block_k": bk, "stages": stages, "warps": warps}, run,
                           ref, ys[0])
        print_best(cell, lambda r: f"M{r['block_m']} N{r['block_n']} K{r['block_k']} s{r['stages']} w{r['warps']}")
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
