"""W4A16 for the fewest rows of decode (GEMV_MAX_ROWS by default: one, GEMV_ROWS_LIMIT at most), on CUDA cores
(Triton): reference.int4_linear's result, without the tensor cores.

At one row the tensor-core kernel (int4_gemm.py) spends about nine instructions a weight: unpack, (q - z) * s, the
bf16 rounding, and a store to shared memory to reach the MMA's operand layout, so it would run at under half the
memory's rate (an H200 issues ~33 T thread-instructions/s; INT4 at 4.8 TB/s is 9.6 T weights/s). Here a weight costs
its unpack and one FMA per row: channel 8 kp + j is nibble j % 4 of word kp (j < 4) or of word kp >> 16, and masked
in place and or-ed with 0x4B000000 it is the float 2^23 + q 16^(j % 4), exactly; one subtraction leaves q 16^(j % 4),
and the row's x, scaled by 16^-(j % 4) once per tile (exact), undoes the place. Each K tile lies in one group, so
sum_k (q - z) s x = s (sum_k q x - z sum_k x), scaled once per tile and column. ROWS is the row bucket's bound
(tiles.ROW_BUCKETS: 1, 2, 4, 8, 16; rows past M repeat row M - 1 and are not stored): each unpacked weight serves
every row. The K loop's SASS (Triton 3.9, ptxas 13, sm_90a): 5.8 instructions a weight at ROWS 1, 8.1 at 2, 12.8 at
4, 22.2 at 8, no spills. (Keeping the words' two halves as [BLOCK_K / 8, 4, BLOCK_N] tensors, with x loaded in that
order to avoid the reshape, compiled to 10.4 at one row: the 3D layouts' conversions.)
The weight is not rounded to the activation dtype before the product (the reference rounds it): the sums differ
from the reference's by float32 and bfloat16 roundings only."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.quant import splitk, tiles

# The default: up to this many rows the GEMV, past it the tensor cores; 0: the tensor cores at every row count. The K
# loop's sm_90a SASS, instructions a weight: this kernel 5.8 at one row, 8.1 at two, 12.8 at four, 22.2 at eight;
# int4_gemm._w4a16_nibbles_kernel 4.8 at any row count up to 16. On the H200 this GEMV took 107 us for a layer at one
# row, 4.4x its bytes floor (gate_up: 1.1 TB/s): bound by the bytes it keeps in flight (two 4 KB tiles a program,
# ~27 KB an SM at gate_up), not by instructions; the nibbles kernel's 4-stage pipeline keeps ~54-64 KB an SM in
# flight on these shapes. A lead, not a measurement: benchmarks/kernels/quant_gemm.py times "w4a16_gemv" (this kernel
# forced at 1-16 rows) beside the default, and flags it where it is faster (set this to 1 then).
GEMV_MAX_ROWS = 1  # the H200's choice: one layer at 1 row 106 us here against the nibbles kernel's 145
GEMV_ROWS_LIMIT = 16


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int  # at most the K tile int4_gemm.int4_block_k allows (one group per tile)
    num_warps: int
    num_stages: int
    # Programs in flight: each keeps two tiles' reads outstanding, and an SM must keep ~36 KB in flight to reach
    # 4.8 TB/s across 132 SMs at ~1 us of latency (4 programs of 2 x 4 KB on the 8B model's o_proj).
    programs_per_sm: int
    min_k_tiles: int


GEMV_CONFIG = GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=1, programs_per_sm=4, min_k_tiles=2)


@triton.jit
def _row_part(X, row, kx, k_mask, q, x_scale):
    """One row's sum_k q x over the tile (q scaled by 16^(k % 4): x_scale undoes it) and its sum_k x."""
    x = tl.load(X + row + kx, mask=k_mask, other=0.0).to(tl.float32)
    return tl.sum(q * (x * x_scale)[:, None], axis=0), tl.sum(x, axis=0)


@triton.jit(do_not_specialize=["M", "stride_ys"], do_not_specialize_on_alignment=["X"])
def _w4a16_gemv_kernel(X, Perm, QW, S, Z, Bias, Y, M, N, K, group_size, stride_xm, stride_qk, stride_sg, stride_ym,
                       stride_ys, k_tiles_per_split, ROWS: tl.constexpr, HAS_PERM: tl.constexpr,
                       HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """Channel 8 kp + j of a word: j < 4 in bits 4j of the word, j >= 4 in bits 4(j - 4) of the word >> 16; masked in
    place and or-ed with 0x4B000000, it is the float 2^23 + q 16^(j % 4) (exact: under 2^24), so one logic
    instruction and one subtraction unpack a weight; the row's x is scaled by 16^-(j % 4) once per tile instead."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_kp = tl.arange(0, BLOCK_K // 8)
    j = tl.arange(0, 8)
    masks = 0xF << ((j % 4) * 4)
    x_scale = ((127 - 4 * (offs_k % 4)) << 23).to(tl.float32, bitcast=True)  # 16^-(k % 4), exactly
    n_mask = offs_n < N
    k_tiles = tl.cdiv(K, BLOCK_K)
    t0 = pid_k * k_tiles_per_split
    t1 = tl.minimum(t0 + k_tiles_per_split, k_tiles)
    offs_r = tl.arange(0, ROWS)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # The next tile's words are loaded before this tile's arithmetic (a register double buffer): this loop has no
    # tensor-core operand for Triton's pipeliner to stage, and each program must keep two tiles' reads in flight.
    kp_end = tl.minimum(t1 * BLOCK_K, K) // 8
    w_ptrs = QW + offs_kp[:, None] * stride_qk + offs_n[None, :]
    kp = t0 * (BLOCK_K // 8) + offs_kp
    next_words = tl.load(w_ptrs + t0 * (BLOCK_K // 8) * stride_qk, mask=n_mask[None, :] & (kp < kp_end)[:, None],
                         other=0)
    for t in range(t0, t1):
        k0 = t * BLOCK_K
        k = k0 + offs_k
        packed = next_words
        kp = (t + 1) * (BLOCK_K // 8) + offs_kp
        next_words = tl.load(w_ptrs + (t + 1) * (BLOCK_K // 8) * stride_qk,
                             mask=n_mask[None, :] & (kp < kp_end)[:, None], other=0)
        if EVEN_K:
            k_mask = k >= 0
        else:
            k_mask = k < K
        src = tl.where(j[None, :, None] < 4, packed[:, None, :], (packed >> 16)[:, None, :])
        bits = tl.reshape((src & masks[None, :, None]) | 0x4B000000, [BLOCK_K, BLOCK_N])
        q = bits.to(tl.float32, bitcast=True) - 8388608.0
        g = k0 // group_size
        s = tl.load(S + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        z = tl.load(Z + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        if HAS_PERM:
            kx = tl.load(Perm + k, mask=k_mask, other=0)
        else:
            kx = k
        for r in tl.static_range(ROWS):  # rows past M repeat row M - 1 (never stored)
            qx, xs = _row_part(X, tl.minimum(M - 1, r) * stride_xm, kx, k_mask, q, x_scale)
            acc = tl.where(offs_r[:, None] == r, acc + (s * (qx - z * xs))[None, :], acc)
    if SPLIT:
        out = Y + pid_k * stride_ys + offs_r[:, None] * stride_ym + offs_n[None, :]
    else:
        out = Y + offs_r[:, None] * stride_ym + offs_n[None, :]
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out, acc.to(Y.dtype.element_ty), mask=(offs_r < M)[:, None] & n_mask[None, :])


def w4a16_gemv(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
               block_k: int, perm: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               cfg: GemvConfig = GEMV_CONFIG) -> torch.Tensor:
    """x2 (M, K) with M <= GEMV_MAX_ROWS -> (M, N) in x2's dtype; block_k: int4_gemm.int4_block_k's K tile (the
    config's block_k caps it)."""
    m, k = x2.shape
    n = qweight.shape[1]
    if not 0 < m <= GEMV_ROWS_LIMIT:
        raise ValueError(f"the INT4 GEMV takes 1..{GEMV_ROWS_LIMIT} rows, got {m}")
    rows = tiles.ROW_BUCKETS[tiles.bucket_of(m)]
    block_k = min(block_k, cfg.block_k)
    grid_n = triton.cdiv(n, cfg.block_n)
    split = tiles.split_k(grid_n, triton.cdiv(k, block_k), tiles.sm_count(x2.device), True, cfg.programs_per_sm,
                          cfg.min_k_tiles)
    y, out = tiles.split_outputs(m, n, x2.dtype, x2.device, split)
    _w4a16_gemv_kernel[(grid_n, split.splits)](
        x2, perm if perm is not None else qweight, qweight, scales, zeros, bias if bias is not None else y, out, m, n,
        k, group_size, x2.stride(0), qweight.stride(0), scales.stride(0), out.stride(-2),
        out.stride(0) if split.splits > 1 else 0, split.k_tiles_per_split, ROWS=rows, HAS_PERM=perm is not None,
        HAS_BIAS=bias is not None, SPLIT=split.splits > 1, EVEN_K=k % block_k == 0, BLOCK_N=cfg.block_n,
        BLOCK_K=block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split.splits > 1:
        splitk.reduce_splits(out, bias, y)
    return y
