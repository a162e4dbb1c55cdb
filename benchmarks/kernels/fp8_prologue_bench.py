"""The step before a per-token FP8 GEMM with the activations' quantization (kernels/quant/fp8_prologue.py) on
Llama-3.1-8B's rows, one device call: RMSNorm with the residual add (4,096 channels) and SiLU-and-mul (14,336), at
1, 8, 64 and 256 rows. Per step: the bf16 step alone (what the bf16 model runs), the step then
fp8_act.quant_fp8_per_token (two launches), the fused launch as serving runs it, and the fused launch at other warp
counts where the warps do not change the bits (SiLU-and-mul: the row's maximum and each value's rounding do not
depend on the order; the norm's sum does, so it keeps rmsnorm's). Each figure is a CUDA-graph replay over input
copies (no L2 hits: benchmarks/lib/gpu_timing.graph_us), beside the bytes floor (inputs read, q and scales written,
at 4.8 TB/s); every variant's q and scale are checked equal to the two launches' first.

    python3 benchmarks/kernels/fp8_prologue_bench.py --out $OUT     # writes $OUT/fp8_prologue_bench.json, ~1 min
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import graph_us, tree  # noqa: E402
from benchmarks.lib.quant_sweep import HBM_TB_S  # noqa: E402
from radixlm.runtime.kernels.elementwise.fused_kernels import rmsnorm, silu_and_mul  # noqa: E402
from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind  # noqa: E402
from radixlm.runtime.kernels.quant import fp8_act, fp8_prologue  # noqa: E402
from radixlm.runtime.kernels.quant.reference import ACT_EPS, FP8_DTYPE, FP8_MAX  # noqa: E402

HIDDEN, INTERMEDIATE = 4096, 14336
ROWS = (1, 8, 64, 256)
SILU_WARPS = (4, 8, 16, 32)


class _Norm(torch.nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.variance_epsilon = 1e-5

    def forward(self, x, residual=None):
        return rmsnorm(x, self.weight, self.variance_epsilon, residual)


class _Silu(torch.nn.Module):
    def forward(self, x):
        return silu_and_mul(x)


def silu_quant_at(x: torch.Tensor, warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_prologue's SiLU-and-mul launch at `warps` warps."""
    m, k = x.shape[0], x.shape[1] // 2
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    fp8_prologue._silu_quant_kernel[(m,)](x, q, scale, x.stride(0), q.stride(0), k, ACT_EPS, FP8_MAX,
                                          BLOCK=triton.next_power_of_2(k), num_warps=warps)
    return q, scale


def cells_for(kind: PrologueKind, m: int, copies: int) -> dict:
    k = HIDDEN if kind is PrologueKind.ADD_RMSNORM else INTERMEDIATE
    width = k if kind is PrologueKind.ADD_RMSNORM else 2 * k
    xs = [torch.randn(m, width, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    if kind is PrologueKind.ADD_RMSNORM:
        norm = _Norm(torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5)
        rs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]

        def step(i):
            return norm(xs[i], rs[i])[0]

        def prologue(i):
            return Prologue(kind, norm, residual=rs[i])
        read = 2 * m * k * 2 + k * 2  # x, residual, weight
        written = m * k * 2  # x + residual
    else:
        silu = _Silu()

        def step(i):
            return silu(xs[i])

        def prologue(i):
            return Prologue(kind, silu)
        read, written = m * width * 2, 0
    floor = (read + written + m * k + 4 * m) / (HBM_TB_S * 1e6)
    want = fp8_act.quant_fp8_per_token(step(0))
    variants = {"step": step, "step_then_quant": lambda i: fp8_act.quant_fp8_per_token(step(i)),
                "fused": lambda i: fp8_prologue.quantized_rows(prologue(i), xs[i])}
    if kind is PrologueKind.SILU_MUL:
        variants.update({f"fused_w{w}": (lambda i, w=w: silu_quant_at(xs[i], w)) for w in SILU_WARPS})
    out = {"kind": kind.name.lower(), "rows": m, "k": k, "floor_us": floor, "us": {}}
    for name, fn in variants.items():
        if name not in ("step", "step_then_quant"):
            q, s = fn(0)
            if not (torch.equal(q.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(s, want[1])):
                out["us"][name] = "different bits"
                continue
        out["us"][name] = round(graph_us(fn, copies), 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    result = {"benchmark": "fp8_prologue_bench", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "command": " ".join(sys.argv), "tree": tree(), "cells": []}
    for kind in (PrologueKind.ADD_RMSNORM, PrologueKind.SILU_MUL):
        for m in args.rows:
            copies = max(2, min(16, -(-200_000_000 // (m * INTERMEDIATE * 4))))
            cell = cells_for(kind, m, copies)
            result["cells"].append(cell)
            print(f"{cell['kind']:>11} rows {m:>3} floor {cell['floor_us']:6.2f} us | " + " | ".join(
                f"{n} {v if isinstance(v, str) else f'{v:7.2f}'}" for n, v in cell["us"].items()), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fp8_prologue_bench.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
