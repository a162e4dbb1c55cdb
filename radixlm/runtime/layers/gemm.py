"""The one GEMM entry point of the model's linear layers and the lm_head: oneDNN-prepacked weights on CPU, the skinny
Triton kernel for the few-row decode GEMMs where it reads weights faster than cuBLAS, cuBLAS otherwise."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.runtime.layers import cpu_gemm

# Measured on an H100 (benchmarks/results/skinny_gemm_gpu.json): the skinny kernel streams large weights at
# 2.8-3.1 TB/s against cuBLAS' 2.6-2.8 at one row (two for the lm_head), and loses on the small qkv and o_proj
# matrices, whose N is too small to fill the GPU without a split-K.
SKINNY_MIN_WEIGHT_ELEMENTS = {1: 50_000_000, 2: 200_000_000}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None) -> torch.Tensor:
    if not x.is_cuda:
        return cpu_gemm.linear(x, weight, bias, packed)
    min_elements = SKINNY_MIN_WEIGHT_ELEMENTS.get(x.shape[0]) if x.dim() == 2 else None
    if min_elements is not None and weight.numel() >= min_elements:
        from radixlm.runtime.layers import skinny_gemm

        if skinny_gemm.usable(x, weight):
            return skinny_gemm.skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)
