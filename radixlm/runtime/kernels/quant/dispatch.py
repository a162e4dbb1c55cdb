"""The quantized GEMMs' entry points (kernels.quant.fp8_linear / int4_linear): CUDA tensors run the CUDA kernels
(fp8_gemm.py, int4_gemm.py: Triton and cuBLASLt), CPU tensors the reference (dequantize, then matmul), from the
same call. Triton modules load on a CUDA call only, so a CPU process imports none."""
from __future__ import annotations

import torch

from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
from radixlm.runtime.kernels.gemm.prologue import Prologue, apply
from radixlm.runtime.kernels.quant import reference


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None,
               bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None,
               prologue: Prologue | None = None, tuned: dict | None = None,
               epilogue: RotaryStore | None = None) -> torch.Tensor:
    """x @ dequant(weight).T + bias in x's dtype. On CUDA the activations are quantized to FP8 (per token, per token
    group of block[1] channels with block weights, or with the static input_scale) and the GEMM runs on the FP8 tensor
    cores (reference.fp8_linear_w8a8; the weight-only kernel, fp8_gemm.W8A16_DEFAULT_MAX_ROWS, is off by default); on
    CPU the activations stay in their dtype (reference.fp8_linear; input_scale is not used there). prologue: x is the
    input before that step (gemm/prologue.py; on CUDA it may run with the activations' quantization). tuned: the
    layer's row count -> tuned cuBLASLt GEMM memo (gemm/tuned_gemm.py), read on CUDA. epilogue: applied (and marked)
    where the CUDA kernel takes it (the few-row kernel at one row), else left to the caller."""
    if x.is_cuda:
        from radixlm.runtime.kernels.quant.fp8_gemm import fp8_linear_cuda

        return fp8_linear_cuda(x, weight, scale, block, bias, input_scale, prologue=prologue, tuned=tuned,
                               epilogue=epilogue)
    return reference.fp8_linear(apply(prologue, x), weight, scale, block, bias)


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                perm: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequant_int4(...).T + bias in x's dtype (x's channels gathered by perm first)."""
    if x.is_cuda:
        from radixlm.runtime.kernels.quant.int4_gemm import int4_linear_cuda

        return int4_linear_cuda(x, qweight, scales, zeros, group_size, perm, bias)
    return reference.int4_linear(x, qweight, scales, zeros, group_size, perm, bias)


def int4_warmup_rows(qweight: torch.Tensor, group_size: int, dtype: torch.dtype) -> tuple[int, ...]:
    """The row counts beyond the row buckets' (tiles.warmup_rows) at which start-up runs an INT4 layer on CUDA: its
    dequantize-then-GEMM path's first (int4_dequant.py: the tuned min_rows, 512 without an entry), which builds that
    kernel and grows the device's scratch to the largest layer before any CUDA graph is captured."""
    if not qweight.is_cuda or dtype not in (torch.bfloat16, torch.float16):
        return ()
    from radixlm.runtime.kernels.quant import int4_dequant

    k, n = qweight.shape[0] * reference.INT4_PACK, qweight.shape[1]
    min_rows = int4_dequant.choice_for(qweight.device, n, k, group_size).min_rows
    return () if min_rows is None else (min_rows,)
