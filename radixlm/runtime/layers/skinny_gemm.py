"""y = x @ W.T for the few rows of a small decode batch (M <= SKINNY_MAX_M), bf16/fp16 on CUDA (Triton).

At batch 1-4 a decode step is a stream of weight reads. Each program reads a [BLOCK_N, K / SPLIT_K] band of W once,
in BLOCK_K steps, and reduces it against every row of x in float32. With SPLIT_K > 1 (matrices whose N alone
cannot fill the GPU) the partial sums go to a float32 workspace and a second kernel adds them (and the bias) and
rounds once, as F.linear does. Tile sizes are autotuned per shape during the warm-up runs before graph capture."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SKINNY_MAX_M = 4

_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
            for bn, bk, w, s in ((8, 512, 4, 3), (16, 256, 4, 4), (16, 512, 4, 3), (32, 256, 8, 3),
                                 (8, 1024, 8, 2), (16, 1024, 8, 2), (4, 1024, 4, 3))]


@triton.autotune(configs=_CONFIGS, key=["N", "K", "M", "SPLIT_K"])
@triton.jit
def _skinny_kernel(X, W, B, Y, Part, N, K, stride_xm, stride_wn, stride_ym,
                   M: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_begin = split * k_per
    k_end = tl.minimum(k_begin + k_per, K)
    acc0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < k_end
        w = tl.load(W + offs_n[:, None] * stride_wn + k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0).to(tl.float32)
        x0 = tl.load(X + k, mask=k_mask, other=0.0).to(tl.float32)
        acc0 += tl.sum(w * x0[None, :], axis=1)
        if M > 1:
            x1 = tl.load(X + stride_xm + k, mask=k_mask, other=0.0).to(tl.float32)
            acc1 += tl.sum(w * x1[None, :], axis=1)
        if M > 2:
            x2 = tl.load(X + 2 * stride_xm + k, mask=k_mask, other=0.0).to(tl.float32)
            acc2 += tl.sum(w * x2[None, :], axis=1)
        if M > 3:
            x3 = tl.load(X + 3 * stride_xm + k, mask=k_mask, other=0.0).to(tl.float32)
            acc3 += tl.sum(w * x3[None, :], axis=1)
    if SPLIT_K > 1:  # partial sums: Part[split, m, n]
        base = Part + split * M * N + offs_n
        tl.store(base, acc0, mask=n_mask)
        if M > 1:
            tl.store(base + N, acc1, mask=n_mask)
        if M > 2:
            tl.store(base + 2 * N, acc2, mask=n_mask)
        if M > 3:
            tl.store(base + 3 * N, acc3, mask=n_mask)
    else:
        if HAS_BIAS:
            b = tl.load(B + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            acc0 += b
            acc1 += b
            acc2 += b
            acc3 += b
        out_ty = Y.dtype.element_ty
        tl.store(Y + offs_n, acc0.to(out_ty), mask=n_mask)
        if M > 1:
            tl.store(Y + stride_ym + offs_n, acc1.to(out_ty), mask=n_mask)
        if M > 2:
            tl.store(Y + 2 * stride_ym + offs_n, acc2.to(out_ty), mask=n_mask)
        if M > 3:
            tl.store(Y + 3 * stride_ym + offs_n, acc3.to(out_ty), mask=n_mask)


@triton.jit
def _split_reduce_kernel(Part, B, Y, N, stride_ym, M: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                         BLOCK: tl.constexpr):
    m = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(Part + (s * M + m) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + m * stride_ym + offs, acc.to(Y.dtype.element_ty), mask=mask)


def split_k_for(n: int, k: int) -> int:
    """Enough programs for ~132 SMs: split K when N gives fewer than ~1000 bands of 8 rows."""
    if n >= 8192 or k < 2048:
        return 1
    return 4 if n * k <= 32_000_000 else 2


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= SKINNY_MAX_M and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and x.stride(1) == 1 and weight.stride(1) == 1)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  split_k: int | None = None) -> torch.Tensor:
    """x: (M, K) with M <= SKINNY_MAX_M; weight: (N, K); returns (M, N) in x's dtype."""
    m, k = x.shape
    n = weight.shape[0]
    split = split_k or split_k_for(n, k)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    b = bias if bias is not None else weight
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), split)  # noqa: E731
    _skinny_kernel[grid](x, weight, b, y, part, n, k, x.stride(0), weight.stride(0), y.stride(0),
                         M=m, SPLIT_K=split, HAS_BIAS=bias is not None)
    if split > 1:
        _split_reduce_kernel[(triton.cdiv(n, 1024), m)](part, b, y, n, y.stride(0), M=m, SPLIT_K=split,
                                                        HAS_BIAS=bias is not None, BLOCK=1024, num_warps=4)
    return y
