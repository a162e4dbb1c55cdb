"""The batch-invariant GEMM's Triton kernel (batch_invariant.py): one tile configuration for every row count and no
split-K, so each output element is the same walk over K in BLOCK_K steps (tl.dot of one fixed tile shape,
accumulated in float32) whatever M is and whatever the other rows hold. Never autotuned: a tuning key on M would
choose per batch again. The tile's width may follow the weight's shape (block_n), which no batch changes: narrower
tiles for narrow weights give a few-row GEMM more programs to read the weight with."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_K = 64
GROUP_M = 8  # M tiles per group of the launch order: a group's programs share A's rows and B's columns in L2
NUM_WARPS = 4
NUM_STAGES = 3
WIDE_N = 16384  # weights with at least this many outputs take 128-wide tiles, others 64


def block_n(n: int) -> int:
    """The tile width for a weight of n outputs (a function of the weight alone)."""
    return 128 if n >= WIDE_N else 64


# M changes every pass, and A is often a view at any offset: neither may build a variant of its own (a build in the
# middle of serving), and none changes the arithmetic.
@triton.jit(do_not_specialize=["M"], do_not_specialize_on_alignment=["A"])
def _batch_invariant_mm_kernel(A, B, C, Bias, M, N, K, stride_am, stride_ak, stride_bn, stride_bk, stride_cm,
                               stride_cn, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped launch order (which tile a program computes, not how): GROUP_M tiles down, then across.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(A + rm[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak, mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)
        b = tl.load(B + rn[None, :] * stride_bn + (k0 + rk)[:, None] * stride_bk, mask=n_ok[None, :] & k_ok[:, None],
                    other=0.0)
        acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        acc += tl.load(Bias + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(C + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(C.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T (+ bias (N,)) -> (M, N) in x's dtype."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"batch-invariant GEMM of {tuple(x.shape)} by {tuple(weight.shape)}.T: the inner sizes "
                         f"differ or an operand is not a matrix")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias of shape {tuple(bias.shape)} for a GEMM of {weight.shape[0]} outputs")
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    width = block_n(n)
    grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, width),)
    _batch_invariant_mm_kernel[grid](
        x, weight, out, bias if bias is not None else out, m, n, k, x.stride(0), x.stride(1), weight.stride(0),
        weight.stride(1), out.stride(0), out.stride(1), HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=width,
        BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
