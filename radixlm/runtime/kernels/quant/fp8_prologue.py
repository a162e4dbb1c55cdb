"""The step before a per-token W8A8 FP8 GEMM with its output quantized in the same launch: RMSNorm (with the
residual add) or SiLU-and-mul (prologue.py's kinds), each row rounded to the activation dtype exactly where
fused_kernels rounds it, then quantized as fp8_act.quant_fp8_per_token quantizes that row. The result is the two
launches' to the bit (q and scale); the bf16 row is never written.

Why: at a batch-64 decode step of an 8B model the per-token quantization was a launch of its own before each of
the 128 GEMMs, 525 us of a 5,151 us step even after its whole-row rewrite (H200,
benchmarks/results/profiling/h200_quant/act_whole/), while the norm or SiLU-and-mul just before it already holds the
whole row in registers. One program a row, the row in registers (fp8_act.WHOLE_ROW_MAX channels at most)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.elementwise.fused_kernels import rmsnorm_row, rmsnorm_warps, silu_mul
from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind
from radixlm.runtime.kernels.quant.fp8_act import WHOLE_ROW_MAX, quant_row
from radixlm.runtime.kernels.quant.reference import ACT_EPS, FP8_DTYPE, FP8_MAX


@triton.jit
def _norm_quant_kernel(X, R, W, Q, S, ResOut, stride_x, stride_r, stride_q, stride_ro, n_cols, eps, act_eps, fp8_max,
                       HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    y = rmsnorm_row(X, R, W, ResOut, row, stride_x, stride_r, stride_ro, n_cols, eps, offs, mask, HAS_RESIDUAL)
    quant_row(y.to(X.dtype.element_ty).to(tl.float32), Q + row * stride_q, S + row, offs, mask, act_eps, fp8_max)


@triton.jit
def _silu_quant_kernel(X, Q, S, stride_x, stride_q, d, act_eps, fp8_max, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < d
    g = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    u = tl.load(X + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    quant_row(silu_mul(g, u).to(X.dtype.element_ty).to(tl.float32), Q + row * stride_q, S + row, offs, mask, act_eps,
              fp8_max)


def takes(prologue: Prologue, x: torch.Tensor) -> bool:
    """Whether quantized_rows runs this step on x: CUDA rows of bfloat16 / float16 with unit column stride, a row of
    at most WHOLE_ROW_MAX outputs, and a norm's weight (and residual) in x's dtype."""
    return (x.is_cuda and x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float16) and x.stride(1) == 1
            and prologue.in_features(x) <= WHOLE_ROW_MAX and prologue.reduce is None and prologue.fits(x))


def quantized_rows(prologue: Prologue, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The step applied to x (M, K), or (M, 2K) = [gate | up], and its output quantized per token: (q (M, K)
    float8_e4m3fn, scale (M, 1) float32), as quant_fp8_per_token(prologue.apply(x)); an ADD_RMSNORM step's
    residual_out is set. The caller checks takes() first."""
    m = x.shape[0]
    k = prologue.in_features(x)
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(k)
    if prologue.kind is PrologueKind.SILU_MUL:
        if m:  # <= 32 values a thread, as fp8_act's whole rows
            _silu_quant_kernel[(m,)](x, q, scale, x.stride(0), q.stride(0), k, ACT_EPS, FP8_MAX, BLOCK=block,
                                     num_warps=min(16, max(4, block // 1024)))
        return q, scale
    r = prologue.residual
    res_out = x
    if r is not None:
        res_out = prologue.residual_out = torch.empty_like(x)
    if m:
        _norm_quant_kernel[(m,)](x, r if r is not None else x, prologue.norm_weight, q, scale, res_out, x.stride(0),
                                 r.stride(0) if r is not None else 0, q.stride(0), res_out.stride(0), k, prologue.eps,
                                 ACT_EPS, FP8_MAX, HAS_RESIDUAL=r is not None, BLOCK=block,
                                 num_warps=rmsnorm_warps(k))  # the norm's sum in rmsnorm's order
    return q, scale
