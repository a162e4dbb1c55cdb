"""W4A16 for the few rows of decode (1..4), shaped like the bf16 skinny GEMM (kernels/gemm/skinny_gemm.py) and
fp8_gemv.py: reference.int4_linear's result in one launch (two with a split K). Off unless this GPU's tuned table
(quant_tuned.py) names a config for the GEMM's shape, group size and row bucket.

int4_gemv.py (the default at one row) ran 4.4x its bytes floor on the H200: two 4 KB tiles a program, ~27 KB an SM in
flight. Here each program streams a [K / SPLIT_K, BLOCK_N] band of qweight (K / 8, N) in [BLOCK_K / 8, BLOCK_N] tiles
of words, 16 bytes a thread along N, the next tile loaded before this tile's arithmetic (a register double buffer),
with SPLIT_K and BLOCK_N chosen so that every SM keeps enough bytes in flight. A tile lies in one quantization group
(BLOCK_K divides the group size, or the weight has one group), so its scales and zeros are one row of (K / g, N),
loaded once a tile.

Unpacking with the fewest operations: channel 8 kp + j of word kp is nibble j % 4 of the word (j < 4) or of the word
>> 16 (j >= 4); masked in place and or-ed with 0x4B000000 (one LOP3) it is the float 2^23 + q 16^(j % 4), exactly,
and one FADD of -(2^23 + z 16^(j % 4)) (per column, once a tile) leaves (q - z) 16^(j % 4); x, loaded as int64 words
of four 16-bit values and widened by shifts (per row and channel, not per weight), is scaled by 16^-(j % 4) (exact).
Per word and row the eight products are summed into one value, then acc = fma(scale, sum, acc); one accumulator
[BLOCK_K / 8, BLOCK_N] a row, reduced once after the loop. Compiled for sm_90 (Triton 3.6 and 3.9, the loop's SASS) at
BLOCK_N 512, BLOCK_K 32, four warps: ~4.8 instructions a weight at one row (LOP3 1.1, FADD 1, FFMA 1.1, x's widening
and scaling ~0.6), ~7 at two, no shared memory; BLOCK_N = 128 x num_warps keeps the scales' and zeros' loads in the
words' layout (other shapes convert them through shared memory, with barriers, every tile). The
weight is not rounded to the activation dtype (the reference rounds it): sums differ from the reference's by float32
and bfloat16 roundings only."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.pdl import pdl_options
from radixlm.runtime.kernels.quant import int4_packed, splitk, tiles
from radixlm.runtime.kernels.quant.x_words import store_rows, widen_word

MAX_ROWS = 4
_XKIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


@dataclass(frozen=True)
class Int4GemvConfig(tiles.SkinnyConfig):
    """int4_skinny's launch; block_k is capped by the group size (int4_gemm.int4_block_k). packed: int4_packed.py's
    bf16x2 kernel for bfloat16 activations (float16 ones keep this module's float32 kernel)."""

    packed: bool = False
    # with packed and a split K: the last program of a column tile sums the partials (int4_packed._reduce_in_kernel),
    # one launch instead of two
    fused_reduce: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.fused_reduce and not self.packed:
            raise ValueError(f"Int4GemvConfig: fused_reduce needs packed, got {self}")


@triton.jit
def _x_eighths(X, row, kp, kp_mask, XKIND: tl.constexpr, EVEN_K: tl.constexpr):
    """x[row, 8 kp + j] for j = 0..7 as float32 [BLOCK_K / 8] tensors, each times 16^-(j % 4). XKIND 0 / 1: X holds
    bfloat16 / float16 as int64 words of four (word 2 kp: channels 8 kp..8 kp + 3); 2: float32 (the interpreter)."""
    if XKIND == 2:
        base = X + row + 8 * kp
        x0 = tl.load(base, mask=kp_mask, other=0.0)
        x1 = tl.load(base + 1, mask=kp_mask, other=0.0)
        x2 = tl.load(base + 2, mask=kp_mask, other=0.0)
        x3 = tl.load(base + 3, mask=kp_mask, other=0.0)
        x4 = tl.load(base + 4, mask=kp_mask, other=0.0)
        x5 = tl.load(base + 5, mask=kp_mask, other=0.0)
        x6 = tl.load(base + 6, mask=kp_mask, other=0.0)
        x7 = tl.load(base + 7, mask=kp_mask, other=0.0)
    else:
        if EVEN_K:
            wa = tl.load(X + row + 2 * kp)
            wb = tl.load(X + row + 2 * kp + 1)
        else:
            wa = tl.load(X + row + 2 * kp, mask=kp_mask, other=0)
            wb = tl.load(X + row + 2 * kp + 1, mask=kp_mask, other=0)
        x0, x1, x2, x3 = widen_word(wa, XKIND)
        x4, x5, x6, x7 = widen_word(wb, XKIND)
    return (x0, x1 * 0.0625, x2 * 0.00390625, x3 * 0.000244140625, x4, x5 * 0.0625, x6 * 0.00390625,
            x7 * 0.000244140625)


@triton.jit
def _row_acc(X, row, kp, kp_mask, q0, q1, q2, q3, q4, q5, q6, q7, s, acc, XKIND: tl.constexpr,
             EVEN_K: tl.constexpr):
    """acc + s * sum_j (q - z)_j x_j over each word's eight channels (q_j already (q - z) 16^(j % 4))."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _x_eighths(X, row, kp, kp_mask, XKIND, EVEN_K)
    t = (q0 * x0[:, None] + q1 * x1[:, None] + q2 * x2[:, None] + q3 * x3[:, None] + q4 * x4[:, None]
         + q5 * x5[:, None] + q6 * x6[:, None] + q7 * x7[:, None])
    return acc + s[None, :] * t


# (word & (0xF << 4j)) | 0x4B000000 in one LOP3 (PTX lop3, table 0xEA = (a & b) | c): written as two operations,
# ptxas emitted two LOP3s (both operands immediate), ~1 instruction a weight more (sm_90, Triton 3.6 and 3.9).
_LOP0 = tl.constexpr("lop3.b32 $0, $1, 15, 1258291200, 234;")
_LOP1 = tl.constexpr("lop3.b32 $0, $1, 240, 1258291200, 234;")
_LOP2 = tl.constexpr("lop3.b32 $0, $1, 3840, 1258291200, 234;")
_LOP3 = tl.constexpr("lop3.b32 $0, $1, 61440, 1258291200, 234;")


@triton.jit
def _nibble(word, j: tl.constexpr, zj, ASM: tl.constexpr):
    """(q - z) 16^j of nibble j (0..3) of word, exactly: zj = 2^23 + z 16^j."""
    if ASM:
        if j == 0:
            bits = tl.inline_asm_elementwise(_LOP0, "=r,r", [word], dtype=tl.int32, is_pure=True, pack=1)
        elif j == 1:
            bits = tl.inline_asm_elementwise(_LOP1, "=r,r", [word], dtype=tl.int32, is_pure=True, pack=1)
        elif j == 2:
            bits = tl.inline_asm_elementwise(_LOP2, "=r,r", [word], dtype=tl.int32, is_pure=True, pack=1)
        else:
            bits = tl.inline_asm_elementwise(_LOP3, "=r,r", [word], dtype=tl.int32, is_pure=True, pack=1)
    else:
        bits = (word & (0xF << (4 * j))) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - zj[None, :]


@triton.jit(do_not_specialize=["M", "stride_ys", "tiles_per_split"], do_not_specialize_on_alignment=["X"])
def _w4a16_skinny_kernel(X, QW, S, Z, Bias, Y, M, N, K, group_size, stride_xm, stride_qk, stride_sg, stride_ym,
                         stride_ys, tiles_per_split, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                         EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, XKIND: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr = False):
    """y[:M] = x[:M] @ dequant(qweight).T (+ bias); program (pid_n, pid_k) sums tiles_per_split BLOCK_K tiles from tile
    pid_k * tiles_per_split. X: XKIND's words (stride_xm in X's elements). Rows past M (up to ROWS <= 4) repeat row
    M - 1 and are not stored."""
    pid_n, pid_k, offs_n, offs_kp, n_mask, kp_start, kp_end, w_ptrs, w_next, r1, r2, r3 = int4_packed.first_w4_tile(
        QW, M, N, K, stride_qk, stride_xm, tiles_per_split, EVEN_K, EVEN_N, BLOCK_N, BLOCK_K, PDL)
    acc0 = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_K // 8, BLOCK_N], dtype=tl.float32)
    for kp0 in range(kp_start, kp_end, BLOCK_K // 8):
        words = w_next
        nxt = kp0 + BLOCK_K // 8
        if EVEN_K and EVEN_N:  # the split's last tile again past its end (no masks)
            w_next = tl.load(w_ptrs + tl.minimum(nxt, kp_end - BLOCK_K // 8) * stride_qk)
        else:
            w_next = tl.load(w_ptrs + nxt * stride_qk, mask=n_mask[None, :] & (nxt + offs_kp < kp_end)[:, None],
                             other=0)
        kp = kp0 + offs_kp
        kp_mask = kp < kp_end
        s, z = int4_packed.group_scales(S, Z, (kp0 * 8) // group_size, stride_sg, offs_n, n_mask, EVEN_N)
        z0 = z + 8388608.0
        z1 = z * 16.0 + 8388608.0
        z2 = z * 256.0 + 8388608.0
        z3 = z * 4096.0 + 8388608.0
        high = words >> 16
        q0 = _nibble(words, 0, z0, ASM)
        q1 = _nibble(words, 1, z1, ASM)
        q2 = _nibble(words, 2, z2, ASM)
        q3 = _nibble(words, 3, z3, ASM)
        q4 = _nibble(high, 0, z0, ASM)
        q5 = _nibble(high, 1, z1, ASM)
        q6 = _nibble(high, 2, z2, ASM)
        q7 = _nibble(high, 3, z3, ASM)
        acc0 = _row_acc(X, 0, kp, kp_mask, q0, q1, q2, q3, q4, q5, q6, q7, s, acc0, XKIND, EVEN_K)
        if ROWS > 1:
            acc1 = _row_acc(X, r1, kp, kp_mask, q0, q1, q2, q3, q4, q5, q6, q7, s, acc1, XKIND, EVEN_K)
        if ROWS > 2:
            acc2 = _row_acc(X, r2, kp, kp_mask, q0, q1, q2, q3, q4, q5, q6, q7, s, acc2, XKIND, EVEN_K)
            acc3 = _row_acc(X, r3, kp, kp_mask, q0, q1, q2, q3, q4, q5, q6, q7, s, acc3, XKIND, EVEN_K)
    store_rows(Y, Bias, offs_n, n_mask, pid_k, M, stride_ym, stride_ys, tl.sum(acc0, axis=0), tl.sum(acc1, axis=0),
               tl.sum(acc2, axis=0), tl.sum(acc3, axis=0), ROWS, HAS_BIAS, SPLIT)


def block_k_of(k: int, group_size: int, cfg: Int4GemvConfig) -> int | None:
    """The K tile: cfg's, capped so that it divides the group size (any, for a single group); None where none of
    16..cfg.block_k does."""
    if group_size >= k:
        return cfg.block_k
    b = cfg.block_k
    while b >= 16:
        if group_size % b == 0:
            return b
        b //= 2
    return None


def takes(m: int, k: int, group_size: int, cfg: Int4GemvConfig) -> bool:
    return 0 < m <= MAX_ROWS and k % 8 == 0 and block_k_of(k, group_size, cfg) is not None


def w4a16_skinny_linear(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                        group_size: int, perm: torch.Tensor | None, bias: torch.Tensor | None,
                        cfg: Int4GemvConfig) -> torch.Tensor:
    """x2 (M, K) bfloat16/float16 (float32: the interpreter), M <= MAX_ROWS -> (M, N) in x2's dtype; qweight
    (K / 8, N) int32, scales and zeros (K / g, N), all with unit column stride (int4_gemm.check_int4's shapes). perm:
    x's channels are gathered first (act-order)."""
    m, k = x2.shape
    n = qweight.shape[1]
    block_k = block_k_of(k, group_size, cfg)
    if not takes(m, k, group_size, cfg) or x2.dtype not in _XKIND or qweight.stride(1) != 1 or (
            scales.stride(1) != 1 or zeros.stride(1) != 1 or scales.stride(0) != zeros.stride(0)):
        raise ValueError(f"the W4A16 few-row kernel takes 1..{MAX_ROWS} rows of float32/bfloat16/float16, K a "
                         f"multiple of 8, a K tile of 16..{cfg.block_k} dividing the group size, unit column strides "
                         f"and scales and zeros of one row stride; got {m} rows {x2.dtype}, K {k}, group {group_size}")
    if perm is not None:
        x2 = x2.index_select(1, perm)
    xkind = _XKIND[x2.dtype]
    if xkind != 2 and (x2.stride(1) != 1 or x2.stride(0) % 4 or x2.data_ptr() % 8):
        x2 = x2.clone()
    xw = x2 if xkind == 2 else x2.view(torch.int64)
    packed = cfg.packed and xkind != 1
    cfg_tiles = triton.cdiv(k, block_k)
    per = triton.cdiv(cfg_tiles, min(cfg.split_k, cfg_tiles))
    splits = triton.cdiv(cfg_tiles, per)
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    out = y if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=x2.device)
    grid_n = triton.cdiv(n, cfg.block_n)
    counters = splitk.counters_for(x2, grid_n, splits, packed and cfg.fused_reduce)
    b = bias if bias is not None else y
    head = (xw, qweight, scales, zeros, b, out)
    ints = (m, n, k, group_size, xw.stride(0), qweight.stride(0), scales.stride(0), out.stride(-2),
            out.stride(0) if splits > 1 else 0)
    consts = dict(ROWS=tiles.ROW_BUCKETS[tiles.bucket_of(m)], HAS_BIAS=bias is not None, SPLIT=splits > 1,
                  EVEN_K=k % block_k == 0, EVEN_N=n % cfg.block_n == 0, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
                  ASM=x2.is_cuda, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_options(x2.device, m))
    if packed:
        int4_packed._w4a16_packed_kernel[(grid_n, splits)](
            *head, y, counters if counters is not None else qweight, *ints[:-1], ints[-1], y.stride(0), per, splits,
            FUSED=counters is not None, SPLIT_P2=triton.next_power_of_2(splits) if counters is not None else 1,
            **consts)
    else:
        _w4a16_skinny_kernel[(grid_n, splits)](*head, *ints, per, XKIND=xkind, **consts)
    if splits > 1 and counters is None:
        splitk.reduce_splits(out, bias, y)
    return y
