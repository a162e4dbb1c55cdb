"""The skinny GEMM with its input's element-wise step fused (layers/prologue.py) against that step's own kernel
followed by the skinny GEMM (and by cuBLAS), on Llama-3.1-8B's decode shapes, bf16, 1-4 rows (issue 20: the batch-1
decode step). Each figure is a CUDA-graph replay over distinct weight copies (as a model's layers), per call.
Also checks the fused results against the unfused ones: bit-identical for SiLU-and-mul and the residual sum; for
the norms, how many outputs differ (the float32 sum of squares is taken in another order).

    python benchmarks/prologue_probe.py --out $OUT/prologue_probe.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import graph_us, weight_copies, write_cells  # noqa: E402
from radixlm.runtime.layers.activation import SiluAndMul  # noqa: E402
from radixlm.runtime.layers.norm import RMSNorm  # noqa: E402
from radixlm.runtime.layers.prologue import Prologue, PrologueKind  # noqa: E402
from radixlm.runtime.layers.skinny_gemm import skinny_linear  # noqa: E402

# name: (N, K, prologue)
CASES = {"qkv_proj+add_rmsnorm": (6144, 4096, PrologueKind.ADD_RMSNORM),
         "qkv_proj+rmsnorm": (6144, 4096, PrologueKind.RMSNORM),
         "gate_up_proj+add_rmsnorm": (28672, 4096, PrologueKind.ADD_RMSNORM),
         "down_proj+silu_mul": (4096, 14336, PrologueKind.SILU_MUL)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--out", default="prologue_probe.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    dev, dt = "cuda", torch.bfloat16
    norm = RMSNorm(4096, 1e-5).to(dev, dt)
    norm.weight.data.normal_(1.0, 0.1)
    act = SiluAndMul()
    cells = []
    for name, (n, k, kind) in CASES.items():
        ws = weight_copies(n, k, k**-0.5, dt, dev)
        copies = len(ws)
        for m in args.rows:
            width = 2 * k if kind is PrologueKind.SILU_MUL else k
            x = torch.randn(m, width, device=dev, dtype=dt) * 2
            res = torch.randn(m, k, device=dev, dtype=dt) if kind is PrologueKind.ADD_RMSNORM else None
            module = act if kind is PrologueKind.SILU_MUL else norm

            def unfused(i, gemm=skinny_linear):
                pro = Prologue(kind, module, res)
                return gemm(pro.apply(x), ws[i]), pro.residual_out

            def fused(i):
                pro = Prologue(kind, module, res)
                return skinny_linear(x, ws[i], None, pro), pro.residual_out

            (y_ref, r_ref), (y, r) = unfused(0), fused(0)
            cell = {"case": name, "n": n, "k": k, "rows": m, "copies": copies,
                    "y_differ": int((y != y_ref).sum()), "y_max_abs_diff": float((y.float() - y_ref.float()).abs().max()),
                    "residual_equal": None if r is None else bool(torch.equal(r, r_ref)),
                    "unfused_skinny_us": graph_us(unfused, copies),
                    "unfused_cublas_us": graph_us(lambda i: unfused(i, lambda a, w: F.linear(a, w)), copies),
                    "fused_us": graph_us(fused, copies)}
            cell["gain_us"] = cell["unfused_skinny_us"] - cell["fused_us"]
            print(f"{name:26s} rows {m}: unfused skinny {cell['unfused_skinny_us']:6.1f} us, cuBLAS "
                  f"{cell['unfused_cublas_us']:6.1f}, fused {cell['fused_us']:6.1f} (gain {cell['gain_us']:+.1f}); "
                  f"outputs differing {cell['y_differ']}/{m * n}, residual equal {cell['residual_equal']}", flush=True)
            cells.append(cell)
            write_cells(args.out, "prologue_probe", cells)
        del ws
        torch.cuda.empty_cache()
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
