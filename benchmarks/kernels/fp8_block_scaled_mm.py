"""FP8 block-scaled GEMMs (1 x 128 activation groups, 128 x 128 weight blocks: DeepSeek-V3, Qwen3-FP8) on Llama-8B's
shapes: radixlm's Triton kernel (fp8_gemm._w8a8, forced by its row bucket's config) against torch._scaled_mm's block
scaling (cuBLASLt, CUDA 12.9+), which fp8_gemm.fp8_block_linear now takes where block_scaled_mm_ok says so. Each row
count: which scale layouts torch accepts (the activations' (M, K / 128) scale row- or column-major; the weight's
(N / 128, K / 128) scale as stored, transposed, or transposed and copied), each accepted layout's relative error
against the Triton kernel, and graph-timed microseconds (the activations' quantization included in both).

    python benchmarks/kernels/fp8_block_scaled_mm.py --out $OUT      # a GPU with FP8 tensor cores
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.gpu_timing import SHAPES, graph_us, tree  # noqa: E402
from radixlm.runtime.kernels.quant import fp8_act, reference as ref, tiles  # noqa: E402
from radixlm.runtime.kernels.quant.fp8_gemm import FP8_CONFIGS, block_scaled_mm_ok, fp8_block_linear  # noqa: E402

BLOCK = (128, 128)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def layouts(x: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor, want: torch.Tensor) -> dict:
    """Each (activation scale, weight scale) layout: torch's relative error against want, or its refusal."""
    q, sx = fp8_act.quant_fp8_per_group(x, BLOCK[1])
    a = {"a_row_major": sx, "a_column_major": sx.t().contiguous().t()}
    b = {"b_as_stored": sw, "b_transposed": sw.t(), "b_transposed_copy": sw.t().contiguous()}
    out = {}
    for an, sa in a.items():
        for bn, sb in b.items():
            try:
                out[f"{an}/{bn}"] = {"rel_err": rel(torch._scaled_mm(q, qw.t(), sa, sb, out_dtype=torch.bfloat16), want)}
            except (RuntimeError, ValueError) as e:
                out[f"{an}/{bn}"] = {"refused": str(e).splitlines()[0][:160]}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[64, 256, 1024, 8192])
    p.add_argument("--shapes", nargs="+", default=["gate_up_proj", "down_proj", "qkv_proj", "o_proj"])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    cells = []
    print(f"{'shape':13s} {'rows':>5s} {'triton us':>10s} {'scaled_mm us':>13s} {'ratio':>6s}  rel err", flush=True)
    for name in args.shapes:
        n, k = SHAPES[name]
        qw, sw = ref.quant_fp8(torch.randn(n, k, device="cuda") * 0.02, block=BLOCK)
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            cfg = FP8_CONFIGS[tiles.bucket_of(m)]
            want = fp8_block_linear(x, qw, sw, BLOCK, None, cfg=cfg)
            cell = {"shape": name, "n": n, "k": k, "rows": m, "layouts": layouts(x, qw, sw, want),
                    "takes_scaled_mm": block_scaled_mm_ok(x, qw, sw, BLOCK)}
            cell["triton_us"] = graph_us(lambda i: fp8_block_linear(x, qw, sw, BLOCK, None, cfg=cfg), 2)
            if cell["takes_scaled_mm"]:
                cell["scaled_mm_us"] = graph_us(lambda i: fp8_block_linear(x, qw, sw, BLOCK, None), 2)
                cell["rel_err"] = rel(fp8_block_linear(x, qw, sw, BLOCK, None), want)
                print(f"{name:13s} {m:5d} {cell['triton_us']:10.1f} {cell['scaled_mm_us']:13.1f} "
                      f"{cell['triton_us'] / cell['scaled_mm_us']:6.2f}  {cell['rel_err']:.1e}", flush=True)
            cells.append(cell)
        del qw, sw
    result = {"benchmark": "fp8_block_scaled_mm", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "tree": tree(), "command": " ".join(sys.argv), "cells": cells}
    path = Path(args.out) / "fp8_block_scaled_mm.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
