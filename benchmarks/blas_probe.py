"""Which BLAS path torch should take for the decode GEMMs (issue 20: at batch 256 cuBLAS's GEMMs take 7.4 ms of a
15.8 ms step, ~1.4x what the weight reads or the tensor cores need): F.linear graph-timed under
torch.backends.cuda.preferred_blas_library "cublas" (torch's default for plain matmuls) and "cublaslt" (cuBLASLt's
heuristic), Llama-3.1-8B's shapes, bf16, the decode row counts. `--layouts nk kn` also times each weight stored
transposed, (K, N) contiguous (cuBLAS's heuristic picks its kernel by the operands' layout too).

    python benchmarks/blas_probe.py --out $OUT/blas_probe.json
    python benchmarks/blas_probe.py --rows 128 256 512 --layouts nk kn --out $OUT/blas_probe_layout.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import SHAPES, graph_us, weight_copies, write_cells  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--layouts", nargs="+", choices=["nk", "kn"], default=["nk"])
    p.add_argument("--out", default="blas_probe.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    cells = []
    paths = [(lib, layout) for layout in args.layouts for lib in ("cublas", "cublaslt")]
    for name in args.shapes:
        n, k = SHAPES[name]
        ws = weight_copies(n, k)
        copies = len(ws)
        ws_kn = [w.t().contiguous() for w in ws] if "kn" in args.layouts else []
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ys = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            cell = {"shape": name, "m": m, "n": n, "k": k, "weight_read_us_at_3tbps": n * k * 2 / 3e6}
            ref = None
            for lib, layout in paths:
                torch.backends.cuda.preferred_blas_library(lib)
                weights = ws if layout == "nk" else ws_kn
                w_op = (lambda i: weights[i].t()) if layout == "nk" else (lambda i: weights[i])
                out = torch.matmul(x, w_op(0)).float()
                ref = out if ref is None else ref
                key = lib if layout == "nk" else f"{lib}_kn"
                cell[key] = {"us": graph_us(lambda i: torch.matmul(x, w_op(i), out=ys[i]), copies),
                             "max_abs_diff": (out - ref).abs().max().item()}
            cell["lt_speedup"] = cell["cublas"]["us"] / cell["cublaslt"]["us"]
            timed = "  ".join(f"{key} {cell[key]['us']:8.1f} us" for key in cell if isinstance(cell[key], dict))
            print(f"{name:13s} M={m:5d}: {timed}  (weights {cell['weight_read_us_at_3tbps']:.1f} us)", flush=True)
            cells.append(cell)
        del ws, ws_kn
        torch.cuda.empty_cache()
    torch.backends.cuda.preferred_blas_library("cublas")
    write_cells(args.out, "blas_probe", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
