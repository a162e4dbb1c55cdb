"""SiLU-and-mul before a per-token FP8 GEMM, with the activations' quantization (kernels/quant/fp8_prologue.py), on
Llama-3.1-8B's rows (14,336 channels), one device call: the bf16 step alone (what the bf16 model runs), the step then
fp8_act.quant_fp8_per_token (two launches), one program a row (the one-launch form), and the two-launch form over
pieces of each row (SPLIT_CHUNK and the other piece widths), at 1 to 2,048 rows. Each figure is a CUDA-graph replay
over input copies (no L2 hits: benchmarks/lib/gpu_timing.graph_us) beside the bytes floor (inputs read, q and scales
written, at 4.8 TB/s); every variant's q and scale are checked equal to the two unfused launches' first. Its
figures set fp8_prologue.SPLIT_MIN_ROWS and SPLIT_CHUNK.

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
from radixlm.runtime.kernels.elementwise.fused_kernels import silu_and_mul  # noqa: E402
from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind  # noqa: E402
from radixlm.runtime.kernels.quant import fp8_act, fp8_prologue  # noqa: E402
from radixlm.runtime.kernels.quant.reference import FP8_DTYPE  # noqa: E402

INTERMEDIATE = 14336
ROWS = (1, 8, 16, 24, 32, 48, 64, 128, 256, 2048)
CHUNKS = (1024, 2048, 4096)


class _Silu(torch.nn.Module):
    def forward(self, x):
        return silu_and_mul(x)


def split_at(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-launch form at piece width `chunk`."""
    m, k = x.shape[0], x.shape[1] // 2
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    fp8_prologue._silu_quant_split(x, q, scale, chunk)
    return q, scale


def cell(m: int, copies: int) -> dict:
    k = INTERMEDIATE
    xs = [torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(copies)]
    silu = _Silu()
    floor = (m * 2 * k * 2 + m * k + 4 * m) / (HBM_TB_S * 1e6)
    want = fp8_act.quant_fp8_per_token(silu(xs[0]))
    variants = {"step": lambda i: silu(xs[i]),
                "step_then_quant": lambda i: fp8_act.quant_fp8_per_token(silu(xs[i])),
                "one_launch": lambda i: fp8_prologue.quantized_rows(Prologue(PrologueKind.SILU_MUL, silu), xs[i],
                                                                    split_min_rows=1 << 30)}
    variants.update({f"split_{c}": (lambda i, c=c: split_at(xs[i], c)) for c in CHUNKS})
    variants["serving"] = lambda i: fp8_prologue.quantized_rows(Prologue(PrologueKind.SILU_MUL, silu), xs[i])
    out = {"rows": m, "k": k, "floor_us": round(floor, 2), "us": {}}
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
              "triton": triton.__version__, "command": " ".join(sys.argv), "tree": tree(),
              "split_min_rows": fp8_prologue.SPLIT_MIN_ROWS, "split_chunk": fp8_prologue.SPLIT_CHUNK, "cells": []}
    for m in args.rows:
        copies = max(2, min(16, -(-200_000_000 // (m * INTERMEDIATE * 4))))
        c = cell(m, copies)
        result["cells"].append(c)
        print(f"rows {m:>4} floor {c['floor_us']:7.2f} us | " + " | ".join(
            f"{n} {v if isinstance(v, str) else f'{v:7.2f}'}" for n, v in c["us"].items()), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fp8_prologue_bench.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
