"""y = x @ W.T for decode batches of MMA_MIN_M..MMA_MAX_M rows, bf16/fp16 on CUDA (Triton), on the tensor cores.

At 8-32 rows cuBLAS's GEMMs of an 8B model ran 15-20% over their weight reads (175-178 us a layer against 145; H100,
CUDA-graph replays, benchmarks/results/kernels/h100/skinny_dot_probe.json). This kernel keeps the skinny kernel's
shape of work (skinny_gemm.py), many programs each streaming a narrow [BLOCK_N, K] band of W, and swaps the
product's operands, acc[BLOCK_N, BLOCK_M] += W_tile @ x_tile^T, so that the band's columns are the MMA's long side
and the few rows its short one. One config ran all four of the model's shapes in 164.7 / 165.9 / 169.3 us a layer at
8 / 16 / 32 rows (cuBLAS 175.1 / 177.3 / 177.5); gemm.linear still times it against cuBLAS per layer kind.

A row's sum does not depend on the other rows nor on how many there are: BLOCK_M (the padded row count, MMA_ROWS)
is the only shape the row count reaches, and past skinny_gemm.SKINNY_MAX_M rows gemm.linear keys its choice on it, so
start-up measures two more row counts (kernel_variants.mma_warmup_rows) however many rows a pass has. M itself is not
specialized on (do_not_specialize)."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from radixlm.runtime.kernels.startup import ParallelBuilds

# At one row the skinny kernel (which also fuses the input's norm there) ran the 8B model's four GEMMs in 157.6 us a
# layer (gemv_sweep.json), this kernel in 163.8 at four rows (skinny_dot_probe.json).
MMA_MIN_M = 2
MMA_ROWS = (16, 32)  # BLOCK_M: the row counts the kernel is built for; MMA_MAX_M = the last
MMA_MAX_M = MMA_ROWS[-1]
BLOCK_N, BLOCK_K, NUM_WARPS, MAX_STAGES = 64, 256, 4, 4


@triton.jit(do_not_specialize=["M"])
def _skinny_mma_kernel(X, W, B, Y, M, N, K, stride_xm, stride_wn, stride_ym, HAS_BIAS: tl.constexpr,
                       EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        w_mask = n_mask[:, None]
        x_mask = m_mask[:, None]
        if not EVEN_K:
            w_mask = w_mask & (k < K)[None, :]
            x_mask = x_mask & (k < K)[None, :]
        w = tl.load(W + offs_n[:, None] * stride_wn + k[None, :], mask=w_mask, other=0.0)
        x = tl.load(X + offs_m[:, None] * stride_xm + k[None, :], mask=x_mask, other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    if HAS_BIAS:
        acc += tl.load(B + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    tl.store(Y + offs_m[None, :] * stride_ym + offs_n[:, None], acc.to(Y.dtype.element_ty),
             mask=n_mask[:, None] & m_mask[None, :])


def block_rows(m: int) -> int:
    """The BLOCK_M that m rows run at (MMA_MIN_M <= m <= MMA_MAX_M)."""
    return next(r for r in MMA_ROWS if r >= m)


@functools.cache
def _stages(device: int, block_m: int, itemsize: int) -> int:
    """Pipeline stages of W and x tiles that fit the device's shared memory (4 on an H100; 0: the kernel is unusable
    there). The 10% margin is Triton's own scratch (the MMA's operand layouts)."""
    smem = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    per_stage = (BLOCK_N + block_m) * BLOCK_K * itemsize
    return min(MAX_STAGES, int(0.9 * smem) // per_stage)


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.is_cuda and x.dim() == 2 and MMA_MIN_M <= x.shape[0] <= MMA_MAX_M
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and x.stride(1) == 1 and weight.stride(1) == 1
            and _stages(x.device.index, MMA_MAX_M, x.element_size()) >= 2)


def skinny_mma_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: (M, K) with MMA_MIN_M <= M <= MMA_MAX_M (usable); weight: (N, K); returns (M, N) in x's dtype, each row's
    float32 sum rounded once, as F.linear."""
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = block_rows(m)
    _skinny_mma_kernel[(triton.cdiv(n, BLOCK_N),)](
        x, weight, bias if bias is not None else weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % BLOCK_K == 0, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=NUM_WARPS, num_stages=_stages(x.device.index, block_m, x.element_size()))
    return y


def prebuild(builds: ParallelBuilds, dtype: torch.dtype, device: torch.device | str,
             biases: tuple[bool, ...] = (False,)) -> int:
    """Hands `builds` the kernel for each BLOCK_M, bias flag and K that is or is not a multiple of BLOCK_K, launched
    as skinny_mma_linear launches it (N, K and the row strides multiples of 16, as the models' are); returns how
    many."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    w = torch.empty(64, 2 * BLOCK_K, dtype=dtype, device=device)
    x = torch.empty(MMA_MAX_M, 2 * BLOCK_K, dtype=dtype, device=device)
    y = torch.empty(MMA_MAX_M, 64, dtype=dtype, device=device)

    def build(block_m: int, bias: bool, k: int) -> None:
        _skinny_mma_kernel.warmup(x, w, w, y, MMA_MIN_M, 64, k, x.stride(0), w.stride(0), y.stride(0),
                                  HAS_BIAS=bias, EVEN_K=k % BLOCK_K == 0, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
                                  BLOCK_K=BLOCK_K, num_warps=NUM_WARPS,
                                  num_stages=_stages(index, block_m, itemsize), grid=(1,))

    if _stages(index, MMA_MAX_M, itemsize) < 2:
        return 0
    jobs = [(block_m, bias, k) for block_m in MMA_ROWS for bias in biases for k in (2 * BLOCK_K, BLOCK_K + 16)]
    for job in jobs:
        builds.submit(build, *job)
    return len(jobs)
