"""FP8 weights, 16-bit activations (W8A16) for the few rows of decode, on CUDA (Triton): reference.fp8_linear's
result (the activations are not quantized), in one launch.

At a few rows an FP8 GEMM only streams its weight, so quantizing the activations buys nothing: the W8A16 path skips
the activation-quantization kernel, the split-K partials and their reduction of the W8A8 path (fp8_gemm._w8a8), three
launches of a few microseconds each in a CUDA graph. It follows the bf16 skinny GEMM's design
(kernels/gemm/skinny_gemm.py): each program reads a [BLOCK_N, K] band of the weight once, in BLOCK_K steps, with
enough programs along N alone to keep every SM streaming, and reduces it against every row of x in float32; each
FP8 weight is widened in registers (exactly: e4m3 is a subset of bfloat16 and float16).

Two modes by row bucket (tiles.ROW_BUCKETS): up to FMA_MAX_ROWS rows the CUDA cores (one FMA a weight and row, the
rows' sums kept as an [ROWS, BLOCK_N] accumulator); past it, up to W8A16_MAX_ROWS, the tensor cores (tl.dot on a
16-row tile, the weight widened to the activation dtype). Scales: per tensor or per channel once after the K loop;
128 x 128 blocks (any power-of-two K size) per K block: a tile's K steps are SUB_K channels wide, each in one block.
The bias is added before the one rounding to the output dtype."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.quant import tiles

FMA_MAX_ROWS = 4
W8A16_MAX_ROWS = 16
DOT_ROWS = 16


@dataclass(frozen=True)
class W8A16Config:
    block_n: int
    block_k: int  # a power of two; with block scales, SUB_K = min(block_k, the block's K size)
    num_warps: int
    num_stages: int


# By row bucket bound (1, 2, 4: CUDA cores; 8, 16: tensor cores). Per-channel (or per-tensor) and block scales.
# Leads, not measurements: skinny_gemm's autotuner took BLOCK_N 8-16 with BLOCK_K 512-1024 for these shapes in bf16;
# an FP8 weight has half the bytes per channel, so the same bytes per step at twice BLOCK_K or BLOCK_N.
# benchmarks/kernels/quant_gemm.py --sweep times the alternatives.
CHANNEL_CONFIGS = {1: W8A16Config(16, 512, 4, 3), 2: W8A16Config(16, 512, 4, 3), 4: W8A16Config(16, 512, 4, 3),
                   8: W8A16Config(32, 256, 4, 4), 16: W8A16Config(32, 256, 4, 4)}
BLOCK_CONFIGS = {1: W8A16Config(16, 512, 4, 3), 2: W8A16Config(16, 512, 4, 3), 4: W8A16Config(16, 512, 4, 3),
                 8: W8A16Config(32, 256, 4, 4), 16: W8A16Config(32, 256, 4, 4)}


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
                part = tl.dot(x, tl.trans(w.to(X.dtype.element_ty)))
                ws = tl.load(WS + (offs_n // GROUP_N) * stride_wsn + ((k0 + sub * SUB_K) // GROUP_K) * stride_wsk,
                             mask=n_mask, other=0.0)
                acc += part * ws[None, :]
            else:
                acc = tl.dot(x, tl.trans(w.to(X.dtype.element_ty)), acc)
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


def rows_bound(m: int) -> int:
    """The bound of m rows' bucket (tiles.ROW_BUCKETS: 1, 2, 4, 8, 16), which picks the config and ROWS."""
    if not 0 < m <= W8A16_MAX_ROWS:
        raise ValueError(f"the W8A16 kernel takes 1..{W8A16_MAX_ROWS} rows, got {m}")
    return tiles.ROW_BUCKETS[tiles.bucket_of(m)]


def config_for(m: int, block: tuple[int, int] | None) -> W8A16Config:
    return (BLOCK_CONFIGS if block is not None else CHANNEL_CONFIGS)[rows_bound(m)]


def takes(m: int, block: tuple[int, int] | None, cfg: W8A16Config | None = None) -> bool:
    """Whether the kernel takes m rows with these weight blocks (on the CUDA cores a program's BLOCK_N channels must
    lie in one block row)."""
    if not 0 < m <= W8A16_MAX_ROWS:
        return False
    cfg = cfg or config_for(m, block)
    return block is None or rows_bound(m) > FMA_MAX_ROWS or block[0] % cfg.block_n == 0


def w8a16_linear(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                 bias: torch.Tensor | None, cfg: W8A16Config | None = None) -> torch.Tensor:
    """x2 (M, K) bfloat16/float16 (float32 under the interpreter) with unit column stride, M <= W8A16_MAX_ROWS ->
    (M, N) in x2's dtype; weight (N, K) FP8 with unit column stride; scale one value, (N,), or block scales
    (ceil(N / bn), ceil(K / bk)) with bk a power of two >= 16 (takes() must hold). cfg: the row bucket's unless
    given (benchmarks/kernels/quant_gemm.py --sweep)."""
    m, k = x2.shape
    n = weight.shape[0]
    cfg = cfg or config_for(m, block)
    if not takes(m, block, cfg):
        raise ValueError(f"the W8A16 kernel at {m} rows takes no {block} blocks with BLOCK_N {cfg.block_n}")
    blockwise = block is not None
    dot = rows_bound(m) > FMA_MAX_ROWS
    sub_k = min(cfg.block_k, block[1]) if blockwise else cfg.block_k
    if blockwise:
        ws, s_n, s_k = scale, scale.stride(0), scale.stride(1)
    else:
        ws = scale.reshape(-1)
        s_n, s_k = (1 if ws.numel() > 1 else 0), 0
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    _w8a16_kernel[(triton.cdiv(n, cfg.block_n),)](
        x2, weight, ws, bias if bias is not None else y, y, m, n, k, x2.stride(0), weight.stride(0), s_n, s_k,
        y.stride(0), ROWS=DOT_ROWS if dot else rows_bound(m), DOT=dot, BLOCKWISE=blockwise,
        GROUP_N=block[0] if blockwise else 1, GROUP_K=block[1] if blockwise else 1, HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SUB_K=sub_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y
