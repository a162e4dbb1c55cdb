"""FP8 weights, 16-bit activations (W8A16) for the few rows of decode, on CUDA (Triton): reference.fp8_linear's
result (the activations are not quantized), in one launch.

At a few rows an FP8 GEMM only streams its weight, so quantizing the activations buys nothing: the W8A16 path skips
the activation-quantization kernel, the split-K partials and their reduction of the W8A8 path (fp8_gemm._w8a8), three
launches of a few microseconds each in a CUDA graph. It follows the bf16 skinny GEMM's design
(kernels/gemm/skinny_gemm.py): each program reads a [BLOCK_N, K] band of the weight once, in BLOCK_K steps, with
enough programs along N alone to keep every SM streaming, and reduces it against every row of x in float32; each
FP8 weight is widened in registers (exactly: e4m3 is a subset of bfloat16 and float16).

Two modes. The tensor cores (the default at every row count up to W8A16_MAX_ROWS): tl.dot on a 16-row tile, the
weight widened to the activation dtype, the loads staged by Triton's pipeliner (cp.async). The CUDA cores (up to
fma_max_rows rows, 0 by default; --sweep times it): one FMA a weight and row, the rows' sums kept as an
[ROWS, BLOCK_N] accumulator, a register double buffer for the loads. Compiled for sm_90a (Triton 3.9, ptxas 13), the
tensor-core K loop ran 3.8-4.9 instructions a weight in the default configs (one F2F, the f16 -> bf16 step of the
e4m3 widening, and half an F2FP a weight among them), the CUDA-core loop 6.7 at one row, 9.5 at two, 14.5 at four
(the e4m3 -> f32 widening's PRMT/F2FP/HADD2 and the in-thread reduction tree), so the tensor cores issue fewer
instructions even at one row, and their loads are pipelined. Scales: per tensor or per channel once after the K
loop; blocks (any power-of-two K size) per K block: on the tensor cores a tile's K steps are SUB_K channels wide,
each in one block; on the CUDA cores x is scaled (a program's channels lie in one block row). The bias is added
before the one rounding to the output dtype."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.quant import tiles

W8A16_MAX_ROWS = 16
DOT_ROWS = 16  # the tensor cores' row tile
FMA_ROWS_LIMIT = 4  # the most rows the CUDA-core mode takes (ROWS: the row bucket's bound, 1, 2 or 4)


@dataclass(frozen=True)
class W8A16Config:
    block_n: int
    block_k: int  # a power of two; with block scales on the tensor cores, SUB_K = min(block_k, the block's K size)
    num_warps: int
    num_stages: int


# The tensor cores' configs, per-channel (or per-tensor) and block scales: WIDE where it still gives every SM two
# programs along N (gate_up at 8B: 896), else NARROW (o_proj, down_proj, qkv at 8B: 256-384 programs). Chosen by the
# K loop's sm_90a SASS (per weight: 4.2 / 4.7 WIDE, 4.2 / 4.4 NARROW, no spills; BLOCK_N 16 on two or more warps
# converts each weight twice) and ~32 KB of weight in flight per program; not yet measured: --sweep times others.
WIDE = {False: W8A16Config(32, 256, 2, 4), True: W8A16Config(32, 256, 2, 4)}
NARROW = {False: W8A16Config(16, 512, 1, 4), True: W8A16Config(16, 512, 1, 4)}
FMA_CONFIG = W8A16Config(16, 512, 4, 1)
PROGRAMS_PER_SM = 2


@triton.jit
def _row_sums(X, stride_xm, M, k, k_mask, w, x_scale, acc, offs_r, ROWS: tl.constexpr):
    """acc[r, :] + sum_k w[:, k] x[r, k] x_scale[k] for each of the ROWS rows (those past M repeat row M - 1: never
    stored)."""
    for r in tl.static_range(ROWS):
        x = tl.load(X + tl.minimum(M - 1, r) * stride_xm + k, mask=k_mask, other=0.0).to(tl.float32)
        part = tl.sum(w * (x * x_scale)[None, :], axis=1)
        acc = tl.where(offs_r[:, None] == r, acc + part[None, :], acc)
    return acc


@triton.jit
def _fma_loop(X, W, WS, M, K, stride_xm, stride_wn, stride_wsk, offs_n, n_mask, offs_r, ROWS: tl.constexpr,
              BLOCKWISE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, EVEN_K: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The CUDA cores' K loop. The next tile is loaded before this one's arithmetic (a register double buffer: these
    loads feed no tl.dot, so Triton's pipeliner does not stage them). Block scales scale x instead of w: the launch
    keeps a program's BLOCK_N channels in one block row (GROUP_N % BLOCK_N == 0), so a K step's scale is one value."""
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = W + offs_n[:, None] * stride_wn + offs_k[None, :]
    if EVEN_K:
        w_next = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
    else:
        w_next = tl.load(w_ptrs, mask=n_mask[:, None] & (offs_k < K)[None, :], other=0.0)
    x_scale = tl.full([BLOCK_K], 1.0, tl.float32)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = w_next
        k = k0 + offs_k
        if EVEN_K:
            k_mask = k >= 0
            w_next = tl.load(w_ptrs + tl.minimum(k0 + BLOCK_K, K - BLOCK_K), mask=n_mask[:, None], other=0.0)
        else:
            k_mask = k < K
            w_next = tl.load(w_ptrs + k0 + BLOCK_K, mask=n_mask[:, None] & (k + BLOCK_K < K)[None, :], other=0.0)
        if BLOCKWISE:
            x_scale = tl.load(WS + (k // GROUP_K) * stride_wsk, mask=k_mask, other=0.0)
        acc = _row_sums(X, stride_xm, M, k, k_mask, w.to(tl.float32), x_scale, acc, offs_r, ROWS)
    return acc


@triton.jit
def _widen(w, dtype: tl.constexpr):
    """e4m3 -> the activation dtype, exactly. To bfloat16 through float16 and float32: the hardware's e4m3x2 -> f16x2
    unpack, an HADD2 to f32 and a pack to bf16x2, where Triton's direct conversion adds an F2F a weight (a conversion
    pipe instruction: ~16 a clock an SM, under the 4.8 TB/s weight rate at 132 SMs)."""
    if dtype == tl.bfloat16:
        return w.to(tl.float16).to(tl.float32).to(tl.bfloat16)
    return w.to(dtype)


@triton.jit
def _dot_loop(X, W, WS, M, K, stride_xm, stride_wn, stride_wsn, stride_wsk, offs_n, n_mask, offs_r,
              ROWS: tl.constexpr, BLOCKWISE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
              EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr):
    """The tensor cores' K loop: each SUB_K step lies in one weight block (SUB_K <= GROUP_K, powers of two)."""
    offs_s = tl.arange(0, SUB_K)
    r_mask = offs_r < M
    w_ptrs = W + offs_n[:, None] * stride_wn + offs_s[None, :]
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        for sub in tl.static_range(BLOCK_K // SUB_K):
            k = k0 + sub * SUB_K + offs_s
            if EVEN_K:
                k_mask = k >= 0
                w = tl.load(w_ptrs + k0 + sub * SUB_K, mask=n_mask[:, None], other=0.0)
            else:
                k_mask = k < K
                w = tl.load(w_ptrs + k0 + sub * SUB_K, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            x = tl.load(X + offs_r[:, None] * stride_xm + k[None, :], mask=r_mask[:, None] & k_mask[None, :],
                        other=0.0)
            if BLOCKWISE:
                part = tl.dot(x, tl.trans(_widen(w, X.dtype.element_ty)))
                ws = tl.load(WS + (offs_n // GROUP_N) * stride_wsn + ((k0 + sub * SUB_K) // GROUP_K) * stride_wsk,
                             mask=n_mask, other=0.0)
                acc += part * ws[None, :]
            else:
                acc = tl.dot(x, tl.trans(_widen(w, X.dtype.element_ty)), acc)
    return acc


@triton.jit(do_not_specialize=["M"], do_not_specialize_on_alignment=["X"])
def _w8a16_kernel(X, W, WS, Bias, Y, M, N, K, stride_xm, stride_wn, stride_wsn, stride_wsk, stride_ym,
                  ROWS: tl.constexpr, DOT: tl.constexpr, BLOCKWISE: tl.constexpr, GROUP_N: tl.constexpr,
                  GROUP_K: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SUB_K: tl.constexpr):
    """y[:M] = x[:M] @ (w * ws).T (+ bias). BLOCKWISE: ws (ceil(N / GROUP_N), ceil(K / GROUP_K)) applied per K
    step; else ws (N,) or one value (stride_wsn 0), applied after the loop."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, ROWS)
    n_mask = offs_n < N
    if DOT:
        acc = _dot_loop(X, W, WS, M, K, stride_xm, stride_wn, stride_wsn, stride_wsk, offs_n, n_mask, offs_r, ROWS,
                        BLOCKWISE, GROUP_N, GROUP_K, EVEN_K, BLOCK_N, BLOCK_K, SUB_K)
    else:
        ws_row = WS + (pid * BLOCK_N // GROUP_N) * stride_wsn
        acc = _fma_loop(X, W, ws_row, M, K, stride_xm, stride_wn, stride_wsk, offs_n, n_mask, offs_r, ROWS,
                        BLOCKWISE, GROUP_N, GROUP_K, EVEN_K, BLOCK_N, BLOCK_K)
    if not BLOCKWISE:
        acc = acc * tl.load(WS + offs_n * stride_wsn, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + offs_r[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty),
             mask=(offs_r < M)[:, None] & n_mask[None, :])


def config_for(m: int, n: int, block: tuple[int, int] | None, sms: int, fma_max_rows: int = 0) -> W8A16Config:
    """The default config of m rows (the CUDA cores' up to fma_max_rows, else by N's programs)."""
    if m <= min(fma_max_rows, FMA_ROWS_LIMIT):
        return FMA_CONFIG
    wide = WIDE[block is not None]
    return wide if triton.cdiv(n, wide.block_n) >= PROGRAMS_PER_SM * sms else NARROW[block is not None]


def takes(m: int, block: tuple[int, int] | None, cfg: W8A16Config | None = None, fma: bool = False) -> bool:
    """Whether the kernel takes m rows with these weight blocks (on the CUDA cores a program's BLOCK_N channels must
    lie in one block row)."""
    if not 0 < m <= (FMA_ROWS_LIMIT if fma else W8A16_MAX_ROWS):
        return False
    return block is None or not fma or block[0] % (cfg or FMA_CONFIG).block_n == 0


def w8a16_linear(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                 bias: torch.Tensor | None, cfg: W8A16Config | None = None, fma_max_rows: int = 0) -> torch.Tensor:
    """x2 (M, K) bfloat16/float16 (float32 under the interpreter) with unit column stride, M <= W8A16_MAX_ROWS ->
    (M, N) in x2's dtype; weight (N, K) FP8 with unit column stride; scale one value, (N,), or block scales
    (ceil(N / bn), ceil(K / bk)) with bk a power of two >= 16. Up to fma_max_rows rows (at most FMA_ROWS_LIMIT) the
    CUDA-core mode, else the tensor cores. cfg: config_for's unless given (benchmarks/kernels/quant_gemm.py
    --sweep)."""
    m, k = x2.shape
    n = weight.shape[0]
    fma = m <= min(fma_max_rows, FMA_ROWS_LIMIT)
    cfg = cfg or config_for(m, n, block, tiles.sm_count(x2.device), fma_max_rows)
    if not takes(m, block, cfg, fma):
        raise ValueError(f"the W8A16 kernel takes 1..{W8A16_MAX_ROWS} rows (CUDA cores: {FMA_ROWS_LIMIT}, BLOCK_N "
                         f"dividing the block's N size), got {m} rows, blocks {block}, BLOCK_N {cfg.block_n}")
    blockwise = block is not None
    sub_k = min(cfg.block_k, block[1]) if blockwise and not fma else cfg.block_k
    if blockwise:
        ws, s_n, s_k = scale, scale.stride(0), scale.stride(1)
    else:
        ws = scale.reshape(-1)
        s_n, s_k = (1 if ws.numel() > 1 else 0), 0
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    _w8a16_kernel[(triton.cdiv(n, cfg.block_n),)](
        x2, weight, ws, bias if bias is not None else y, y, m, n, k, x2.stride(0), weight.stride(0), s_n, s_k,
        y.stride(0), ROWS=tiles.ROW_BUCKETS[tiles.bucket_of(m)] if fma else DOT_ROWS, DOT=not fma,
        BLOCKWISE=blockwise, GROUP_N=block[0] if blockwise else 1, GROUP_K=block[1] if blockwise else 1,
        HAS_BIAS=bias is not None, EVEN_K=k % cfg.block_k == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        SUB_K=sub_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y
