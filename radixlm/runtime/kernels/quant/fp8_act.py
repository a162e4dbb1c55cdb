"""FP8 quantization of a GEMM's activations on CUDA (Triton), as reference.quant_fp8_act defines it: per token (the
per-tensor and per-channel weights' GEMMs), per token group of the weight blocks' K size (block weights, as DeepSeek-V3
and SGLang's w8a8_block_fp8 quantize them), or with a static scale. One launch each; the row count enters through the
grid only, so one kernel serves every batch."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.numerics import div_rn_f32
from radixlm.runtime.kernels.quant.reference import ACT_EPS, FP8_DTYPE, FP8_MAX

TOKEN_BLOCK = 1024
# Rows up to this long are read once, into registers (WHOLE): in BLOCK-wide steps each program made 2 K / BLOCK
# dependent round trips, and a batch-64 FP8 decode step's 128 launches took 667 us (5.2 us each; H200,
# benchmarks/results/profiling/h200_quant/).
WHOLE_ROW_MAX = 16384
GROUPS_PER_PROGRAM = 8


@triton.jit
def store_row_q(x, scale, Q_row, offs, mask, fp8_max):
    """x (float32) / scale, correctly rounded, saturated and stored as FP8 at Q_row + offs."""
    q = tl.clamp(div_rn_f32(x, scale), -fp8_max, fp8_max)
    tl.store(Q_row + offs, q.to(Q_row.dtype.element_ty), mask=mask)


@triton.jit
def quant_row(x, Q_row, S_row, offs, mask, eps, fp8_max):
    """A whole row x (float32, masked lanes 0) quantized per token: its scale max(amax, eps) / fp8_max stored at
    S_row, x / scale at Q_row + offs."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), eps) / fp8_max
    tl.store(S_row, scale)
    store_row_q(x, scale, Q_row, offs, mask, fp8_max)


@triton.jit(do_not_specialize_on_alignment=["X"])
def _quant_rows_kernel(X, Q, S, K, stride_xm, stride_qm, eps, fp8_max, STATIC: tl.constexpr, BLOCK: tl.constexpr,
                       WHOLE: tl.constexpr = False):
    """One row per program: its absolute maximum over K, then q = x / scale (STATIC: the scale at S, one value).
    WHOLE: the row in one BLOCK >= K, loaded once."""
    row = tl.program_id(0)
    x_row = X + row * stride_xm
    if WHOLE:
        k = tl.arange(0, BLOCK)
        x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
        if STATIC:
            store_row_q(x, tl.load(S).to(tl.float32), Q + row * stride_qm, k, k < K, fp8_max)
        else:
            quant_row(x, Q + row * stride_qm, S + row, k, k < K, eps, fp8_max)
        return
    if STATIC:
        scale = tl.load(S).to(tl.float32)
    else:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            k = k0 + tl.arange(0, BLOCK)
            amax = tl.maximum(amax, tl.abs(tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)))
        scale = tl.maximum(tl.max(amax, axis=0), eps) / fp8_max
        tl.store(S + row, scale)
    for k0 in range(0, K, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
        store_row_q(x, scale, Q + row * stride_qm, k, k < K, fp8_max)


@triton.jit(do_not_specialize_on_alignment=["X"])
def _quant_groups_kernel(X, Q, S, K, n_groups, stride_xm, stride_qm, stride_sm, stride_sg, eps, fp8_max,
                         GROUP: tl.constexpr, GROUPS: tl.constexpr):
    """GROUPS groups of GROUP channels of one row per program, each with its own scale."""
    row = tl.program_id(0)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    k = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = (g[:, None] < n_groups) & (k < K)
    x = tl.load(X + row * stride_xm + k, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), eps) / fp8_max
    q = tl.clamp(div_rn_f32(x, scale[:, None]), -fp8_max, fp8_max)
    tl.store(Q + row * stride_qm + k, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row * stride_sm + g * stride_sg, scale, mask=g < n_groups)


def _check(x: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"FP8 activation quantization takes (M, K) rows with unit column stride, got {tuple(x.shape)}"
                         f" strides {x.stride()}")


def quant_fp8_per_token(x: torch.Tensor, static_scale: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (M, K) float8_e4m3fn, scale): scale (M, 1) float32 per token, or static_scale (one value, float32)."""
    _check(x)
    m, k = x.shape
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    if static_scale is not None:
        if static_scale.numel() != 1:
            raise ValueError(f"a static activation scale has one value, got shape {tuple(static_scale.shape)}")
        scale = static_scale.to(torch.float32).reshape(())
    else:
        scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    whole = k <= WHOLE_ROW_MAX
    block = triton.next_power_of_2(k) if whole else TOKEN_BLOCK
    _quant_rows_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0), ACT_EPS, FP8_MAX,
                             STATIC=static_scale is not None, BLOCK=block, WHOLE=whole,
                             num_warps=min(16, max(4, block // 1024)))  # <= 32 values a thread
    return q, scale


def quant_fp8_per_group(x: torch.Tensor, group: int, column_major: bool = False,
                        rows_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (M, K) float8_e4m3fn, scale (M, ceil(K / group)) float32); group a power of two >= 16. column_major: the
    scale's rows are its inner dimension (strides (1, M)), as torch._scaled_mm's 1 x 128 block scaling takes it.
    rows_multiple: q and scale have M rounded up to a multiple of it, the rows past M unset (a GEMM's rows are
    independent: their outputs are dropped)."""
    _check(x)
    if group < 16 or group & (group - 1):
        raise ValueError(f"an activation group of {group} channels: the kernel takes powers of two >= 16")
    m, k = x.shape
    n_groups = triton.cdiv(k, group)
    rows = triton.cdiv(m, rows_multiple) * rows_multiple
    q = torch.empty(rows, k, dtype=FP8_DTYPE, device=x.device)
    if column_major:
        scale = torch.empty(n_groups, rows, dtype=torch.float32, device=x.device).t()
    else:
        scale = torch.empty(rows, n_groups, dtype=torch.float32, device=x.device)
    per = max(1, min(GROUPS_PER_PROGRAM, TOKEN_BLOCK // group))
    _quant_groups_kernel[(m, triton.cdiv(n_groups, per))](
        x, q, scale, k, n_groups, x.stride(0), q.stride(0), scale.stride(0), scale.stride(1), ACT_EPS, FP8_MAX,
        GROUP=group, GROUPS=per, num_warps=4)
    return q, scale
