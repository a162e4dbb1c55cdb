"""The split-K partials' reduction of the quantized GEMMs (tiles.split_k): one launch sums the float32 partials,
adds the bias and rounds once to the output dtype (Triton)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def tile_range(M, N, K, k_tiles_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The program's output tile (grid: N tiles, M tiles, K splits) and its K tiles [t0, t1): offs_m, offs_n, offs_k,
    m_mask, n_mask, t0, t1, pid_k."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    t0 = pid_k * k_tiles_per_split
    t1 = tl.minimum(t0 + k_tiles_per_split, tl.cdiv(K, BLOCK_K))
    return offs_m, offs_n, tl.arange(0, BLOCK_K), offs_m < M, offs_n < N, t0, t1, pid_k


@triton.jit
def store_tile(acc, Y, Bias, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_ys, pid_k, SPLIT: tl.constexpr,
               HAS_BIAS: tl.constexpr):
    """A GEMM tile's float32 result: with SPLIT, program pid_k's partial into its slice of Y (float32, summed by
    reduce_splits); else plus the bias, rounded once to Y's dtype."""
    y_ptrs = Y + offs_m[:, None] * stride_ym + offs_n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT:
        tl.store(y_ptrs + pid_k * stride_ys, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "splits", "stride_ps"])
def _reduce_splits_kernel(P, B, Y, M, N, splits, stride_ps, stride_pm, stride_ym, HAS_BIAS: tl.constexpr,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, splits):
        acc += tl.load(P + s * stride_ps + row * stride_pm + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_ym + offs, acc.to(Y.dtype.element_ty), mask=mask)


REDUCE_BLOCK = 1024


def reduce_splits(partials: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """out (M, N) = sum over the splits of partials (S, M, N) float32, + bias, rounded once to out's dtype."""
    s, m, n = partials.shape
    _reduce_splits_kernel[(m, triton.cdiv(n, REDUCE_BLOCK))](
        partials, bias if bias is not None else partials, out, m, n, s, partials.stride(0), partials.stride(1),
        out.stride(0), HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK, num_warps=4)
    return out
