"""The one GEMM entry point of the model's linear layers and the lm_head: oneDNN-prepacked weights on CPU; on CUDA,
for the few-row GEMMs of small decode batches, whichever of the skinny Triton kernel and cuBLAS is faster for that
weight and row count, measured once per layer and row count (in the warm-up runs before CUDA-graph capture)."""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from radixlm.runtime.layers import cpu_gemm

MEASURE_REPS = 10
SKINNY_MARGIN = 0.97  # the skinny kernel must win by 3% to be used


def _time_us(fn, flush: torch.Tensor, reps: int = MEASURE_REPS) -> float:
    """Median device time of one call of fn, as a CUDA-graph replay in a model's forward pays it: each call follows a
    write of `flush` (larger than the L2 cache), which evicts the weight as the other layers would and keeps the
    device busy while the host launches fn. Back-to-back calls instead measured the launch's host cost, larger for a
    Triton kernel than for cuBLAS (on an H100 that picked cuBLAS for the 8B model's qkv, o and down projections at
    batch 1, where the skinny kernel is 8-19% faster in graphs: benchmarks/results/kernels_h100/gemv_sweep.json)."""
    for _ in range(3):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) * 1e3


def _prefer_skinny(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    from radixlm.runtime.layers.skinny_gemm import skinny_linear

    l2 = torch.cuda.get_device_properties(x.device).L2_cache_size
    flush = torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device=x.device)
    skinny = _time_us(lambda: skinny_linear(x, weight, bias), flush)
    cublas = _time_us(lambda: F.linear(x, weight, bias), flush)
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
