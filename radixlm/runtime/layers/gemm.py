"""The one GEMM entry point of the model's linear layers and the lm_head: oneDNN-prepacked weights on CPU; on CUDA,
for the few-row GEMMs of small decode batches, whichever of the skinny Triton kernel and cuBLAS is faster for that
weight and row count, measured once per layer and row count (in the warm-up runs before CUDA-graph capture)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.runtime.layers import cpu_gemm

MEASURE_REPS = 10
SKINNY_MARGIN = 0.97  # the skinny kernel must win by 3% to be used


def _time_us(fn, reps: int = MEASURE_REPS) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _prefer_skinny(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    from radixlm.runtime.layers.skinny_gemm import skinny_linear

    skinny = _time_us(lambda: skinny_linear(x, weight, bias))
    cublas = _time_us(lambda: F.linear(x, weight, bias))
    return skinny < SKINNY_MARGIN * cublas


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None,
           choices: dict[int, bool] | None = None) -> torch.Tensor:
    """choices: the calling layer's memo, row count -> use the skinny kernel (None: always cuBLAS on CUDA)."""
    if not x.is_cuda:
        return cpu_gemm.linear(x, weight, bias, packed)
    if choices is not None and x.dim() == 2:
        from radixlm.runtime.layers import skinny_gemm

        m = x.shape[0]
        if skinny_gemm.usable(x, weight):
            use = choices.get(m)
            if use is None and not torch.cuda.is_current_stream_capturing():
                use = choices[m] = _prefer_skinny(x, weight, bias)
            if use:
                return skinny_gemm.skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)
