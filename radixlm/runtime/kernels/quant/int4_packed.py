"""int4_skinny.py's few-row W4A16 kernel with the dequantization and the products in packed bf16x2 arithmetic (an
Int4GemvConfig with packed=True, bfloat16 activations; only a tuned-table entry selects it).

int4_skinny's K loop (sm_90a SASS, Triton 3.9, BLOCK_N 512, BLOCK_K 64, four warps, one row) issues ~4.3 instructions a
weight in float32 (a LOP3, an FADD and an FFMA a weight, x's widening and 16^-j scaling) and holds 255 registers a
thread (the [BLOCK_K / 8, BLOCK_N] accumulators and every nibble of the tile live at once), so two programs fit an SM
and ~32 KB of weight is in flight per SM: ~28% of the H200's bandwidth on Llama-3.1-8B's layer. Here, per 32-bit word
w of eight nibbles (channels 8 kp + j) and per column:

- dequantize (once, any row count): LOP3(w >> 4j, 0x000F000F, 0x43004300) for j = 0..3 is the bf16x2 pair (128 + q_j,
  128 + q_(j+4)), exactly (bf16's ulp at 128 is 1); one fma.rn.bf16x2 by 1 adds -(128 + z) to both, leaving (q_j - z,
  q_(j+4) - z), exact integers: 3 SHF + 4 LOP3 + 4 HFMA2 a word;
- multiply (per row): the pairs times x's pairs (x_j, x_(j+4)) and summed in bf16x2 (one HMUL2, three HFMA2), the two
  halves widened to float32 (a shift and a mask) and added: 7 instructions a word and row; x's pairs are formed once per
  kp and thread (PRMT-like shifts), shared by the thread's four columns;
- the scale: per tile (one group) the float32 word sums are added along kp inside the thread and multiplied by the
  column's scale once (acc += s * sum), so a row keeps one float32 accumulator a column, not one a kp.

So ~2.4 instructions a weight at one row, ~3.3 at two, ~5.1 at four (the loop's SASS at 512 x 64 and 512 x 32: 3.0,
4.5, 7.0 with x's loads and the loop's own), and far fewer live registers (128 at 512 x 64 on four warps), which lets
more programs (and their next tiles, loaded before this tile's arithmetic) share an SM. With fused_reduce a split K is
summed in the same launch by each column tile's last program (_reduce_in_kernel; splitk.split_counters).

Arithmetic against reference.int4_linear (which rounds (q - z) s to the activation dtype, then sums in float32): here
(q - z) is exact, each product (q - z) x is rounded to bf16 (8 significant bits) and the four products of a half word
are summed in bf16 (three more roundings) before float32 takes over; the scale multiplies float32 sums. Each rounding is
relative 2^-9 of a partial sum of at most four products, about the size of the reference's own rounding of each weight,
and they add up like it: on the 8B shapes the error stays near bf16's output rounding (the sweep's check: 2e-2 of the
output's largest magnitude; the interpreter tests take 1e-2). float16 activations are not packed (f16x2 products of
outliers above 4096 would overflow): they run int4_skinny's float32 kernel at the same config. Under the interpreter
(no inline asm) the same roundings are emulated in float32 (.to(bfloat16) at each step)."""
from __future__ import annotations

import triton
import triton.language as tl

from radixlm.runtime.kernels.pdl import pdl_wait
from radixlm.runtime.kernels.quant.splitk import last_to_arrive, reset_counter
from radixlm.runtime.kernels.quant.x_words import store_rows

# (128 + q_j, 128 + q_(j+4)) - (128 + z) for j = 0..3 of word $4; $5: -(128 + z) as a bf16x2 pair. lop3 table 0xEA is
# (a & b) | c.
_DEQUANT = tl.constexpr(
    "{ .reg .b32 t, one; mov.b32 one, 0x3F803F80;"
    " lop3.b32 $0, $4, 0x000F000F, 0x43004300, 0xEA;"
    " shr.u32 t, $4, 4; lop3.b32 $1, t, 0x000F000F, 0x43004300, 0xEA;"
    " shr.u32 t, $4, 8; lop3.b32 $2, t, 0x000F000F, 0x43004300, 0xEA;"
    " shr.u32 t, $4, 12; lop3.b32 $3, t, 0x000F000F, 0x43004300, 0xEA;"
    " fma.rn.bf16x2 $0, $0, one, $5; fma.rn.bf16x2 $1, $1, one, $5;"
    " fma.rn.bf16x2 $2, $2, one, $5; fma.rn.bf16x2 $3, $3, one, $5; }")
# sum_j (q_j - z) x_j over a word's eight channels: $1..$4 the dequantized pairs, $5..$8 x's pairs; the bf16x2 sum's
# halves widened to float32 (bits in $0).
_DOT = tl.constexpr(
    "{ .reg .b32 p, nz, lo; .reg .f32 a, b; mov.b32 nz, 0x80008000;"
    " fma.rn.bf16x2 p, $1, $5, nz; fma.rn.bf16x2 p, $2, $6, p;"
    " fma.rn.bf16x2 p, $3, $7, p; fma.rn.bf16x2 p, $4, $8, p;"
    " shl.b32 lo, p, 16; and.b32 p, p, 0xFFFF0000; mov.b32 a, lo; mov.b32 b, p;"
    " add.f32 a, a, b; mov.b32 $0, a; }")

# x's words (x0 | x1 << 16, x2 | x3 << 16, x4 | x5 << 16, x6 | x7 << 16) -> the pairs (x_j, x_(j+4)): one PRMT each.
_PAIRS = tl.constexpr("prmt.b32 $0, $4, $6, 0x5410; prmt.b32 $1, $4, $6, 0x7632; "
                      "prmt.b32 $2, $5, $7, 0x5410; prmt.b32 $3, $5, $7, 0x7632;")


@triton.jit
def _x_pairs(X, row, kp, kp_mask, EVEN_K: tl.constexpr):
    """x[row] as bf16x2 pairs (x_(8kp+j), x_(8kp+j+4)), j = 0..3, [BLOCK_K / 8] int32 each; X: int64 words of four."""
    if EVEN_K:
        wa = tl.load(X + row + 2 * kp)
        wb = tl.load(X + row + 2 * kp + 1)
    else:
        wa = tl.load(X + row + 2 * kp, mask=kp_mask, other=0)
        wb = tl.load(X + row + 2 * kp + 1, mask=kp_mask, other=0)
    return tl.inline_asm_elementwise(_PAIRS, "=r,=r,=r,=r,r,r,r,r", [wa.to(tl.int32), (wa >> 32).to(tl.int32),
                                                                    wb.to(tl.int32), (wb >> 32).to(tl.int32)],
                                     dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _row_sum(X, row, kp, kp_mask, d0, d1, d2, d3, EVEN_K: tl.constexpr):
    """Per word, sum_j (q_j - z) x_j (float32, [BLOCK_K / 8, BLOCK_N]) from the dequantized pairs d0..d3."""
    p0, p1, p2, p3 = _x_pairs(X, row, kp, kp_mask, EVEN_K)
    bits = tl.inline_asm_elementwise(
        _DOT, "=r,r,r,r,r,r,r,r,r",
        [d0, d1, d2, d3, tl.broadcast_to(p0[:, None], d0.shape), tl.broadcast_to(p1[:, None], d0.shape),
         tl.broadcast_to(p2[:, None], d0.shape), tl.broadcast_to(p3[:, None], d0.shape)],
        dtype=tl.int32, is_pure=True, pack=1)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _bf16(v):
    return v.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _row_sum_emulated(X, row, kp, kp_mask, words, z):
    """_row_sum's roundings in float32 (the interpreter: X float32, rounded to bf16 as the kernel's input would be)."""
    base = X + row + 8 * kp
    lo = tl.zeros_like(words).to(tl.float32)
    hi = tl.zeros_like(words).to(tl.float32)
    for j in tl.static_range(4):
        xl = _bf16(tl.load(base + j, mask=kp_mask, other=0.0))
        xh = _bf16(tl.load(base + j + 4, mask=kp_mask, other=0.0))
        ql = ((words >> (4 * j)) & 0xF).to(tl.float32) - z[None, :]
        qh = ((words >> (4 * j + 16)) & 0xF).to(tl.float32) - z[None, :]
        lo = _bf16(ql * xl[:, None] + lo)
        hi = _bf16(qh * xh[:, None] + hi)
    return lo + hi


@triton.jit
def _split_sum(Y, row, offs_n, n_mask, stride_ys, splits, SPLIT_P2: tl.constexpr):
    """sum_s Y[s, row] over the splits as one [SPLIT_P2, BLOCK_N] load (one L2 round trip, not one a split), added
    inside each thread in split order; L2 reads (.cg): the partials were written by other SMs."""
    offs_s = tl.arange(0, SPLIT_P2)
    parts = tl.load(Y + row + offs_s[:, None] * stride_ys + offs_n[None, :],
                    mask=(offs_s < splits)[:, None] & n_mask[None, :], other=0.0, cache_modifier=".cg")
    return tl.sum(parts, axis=0)


@triton.jit
def _reduce_in_kernel(Y, Out, Bias, Cnt, offs_n, n_mask, pid_n, M, stride_ym, stride_ys, stride_om, splits,
                      ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_P2: tl.constexpr):
    """After this program's partial is in Y[pid_k]: the last of column tile pid_n's `splits` programs to arrive (the
    counter Cnt[pid_n], released after the program's stores, acquired before the loads) sums the partials (the sum's
    order does not depend on which program arrives last) into Out, plus the bias, and zeroes the counter for the next
    launch on the stream."""
    if last_to_arrive(Cnt, pid_n, splits):
        y0 = _split_sum(Y, 0, offs_n, n_mask, stride_ys, splits, SPLIT_P2)
        y1 = y0
        y2 = y0
        y3 = y0
        if ROWS > 1:  # rows past M: partials never stored, outputs never stored
            y1 = _split_sum(Y, stride_ym, offs_n, n_mask, stride_ys, splits, SPLIT_P2)
        if ROWS > 2:
            y2 = _split_sum(Y, 2 * stride_ym, offs_n, n_mask, stride_ys, splits, SPLIT_P2)
            y3 = _split_sum(Y, 3 * stride_ym, offs_n, n_mask, stride_ys, splits, SPLIT_P2)
        store_rows(Out, Bias, offs_n, n_mask, 0, M, stride_om, 0, y0, y1, y2, y3, ROWS, HAS_BIAS, False)
        reset_counter(Cnt, pid_n)


@triton.jit
def group_scales(S, Z, g, stride_sg, offs_n, n_mask, EVEN_N: tl.constexpr):
    """Group g's scales and zeros of the program's columns, in float32 (EVEN_N: no mask)."""
    if EVEN_N:
        s = tl.load(S + g * stride_sg + offs_n).to(tl.float32)
        z = tl.load(Z + g * stride_sg + offs_n).to(tl.float32)
    else:
        s = tl.load(S + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        z = tl.load(Z + g * stride_sg + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    return s, z


@triton.jit
def first_w4_tile(QW, M, N, K, stride_qk, stride_xm, tiles_per_split, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """The few-row W4A16 kernels' start (grid: N tiles, K splits): the program's column tile, its packed-K range
    [kp_start, kp_end), the first tile of packed weights, and the x offsets of rows 1-3 (repeating row M - 1). PDL
    (pdl.py): the first tile is loaded before the wait for the previous kernel."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kp = tl.arange(0, BLOCK_K // 8)
    n_mask = offs_n < N
    kp_start = pid_k * tiles_per_split * (BLOCK_K // 8)
    kp_end = tl.minimum(kp_start + tiles_per_split * (BLOCK_K // 8), K // 8)
    w_ptrs = QW + offs_kp[:, None] * stride_qk + offs_n[None, :]
    if EVEN_K and EVEN_N:
        w_next = tl.load(w_ptrs + kp_start * stride_qk)
    else:
        w_next = tl.load(w_ptrs + kp_start * stride_qk, mask=n_mask[None, :] & (kp_start + offs_kp < kp_end)[:, None],
                         other=0)
    pdl_wait(PDL)
    r1 = tl.minimum(1, M - 1) * stride_xm
    r2 = tl.minimum(2, M - 1) * stride_xm
    r3 = tl.minimum(3, M - 1) * stride_xm
    return pid_n, pid_k, offs_n, offs_kp, n_mask, kp_start, kp_end, w_ptrs, w_next, r1, r2, r3


@triton.jit(do_not_specialize=["M", "stride_ys", "tiles_per_split", "splits"],
            do_not_specialize_on_alignment=["X"])
def _w4a16_packed_kernel(X, QW, S, Z, Bias, Y, Out, Cnt, M, N, K, group_size, stride_xm, stride_qk, stride_sg,
                         stride_ym, stride_ys, stride_om, tiles_per_split, splits, ROWS: tl.constexpr,
                         HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, FUSED: tl.constexpr, EVEN_K: tl.constexpr,
                         EVEN_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
                         SPLIT_P2: tl.constexpr, PDL: tl.constexpr = False):
    """int4_skinny._w4a16_skinny_kernel's launch and result (rows past M, up to ROWS <= 4, repeat row M - 1 and are
    not stored); X: int64 words of four bf16 (ASM) or float32 (the interpreter's emulation). SPLIT: Y holds the
    float32 partials; FUSED (with SPLIT): the column tile's last program sums them into Out (_reduce_in_kernel),
    else splitk.reduce_splits does, in a launch of its own."""
    pid_n, pid_k, offs_n, offs_kp, n_mask, kp_start, kp_end, w_ptrs, w_next, r1, r2, r3 = first_w4_tile(
        QW, M, N, K, stride_qk, stride_xm, tiles_per_split, EVEN_K, EVEN_N, BLOCK_N, BLOCK_K, PDL)
    acc0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for kp0 in range(kp_start, kp_end, BLOCK_K // 8):
        words = w_next
        nxt = kp0 + BLOCK_K // 8
        if EVEN_K and EVEN_N:  # nothing past the split's end (a program of one tile loads it once)
            w_next = tl.load(w_ptrs + nxt * stride_qk, mask=(offs_kp * 0 + nxt < kp_end)[:, None], other=0)
        else:
            w_next = tl.load(w_ptrs + nxt * stride_qk, mask=n_mask[None, :] & (nxt + offs_kp < kp_end)[:, None],
                             other=0)
        kp = kp0 + offs_kp
        kp_mask = kp < kp_end
        s, z = group_scales(S, Z, (kp0 * 8) // group_size, stride_sg, offs_n, n_mask, EVEN_N)
        if ASM:
            zb = (-(z + 128.0)).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            nzz = tl.broadcast_to((zb | (zb << 16))[None, :], words.shape)
            d0, d1, d2, d3 = tl.inline_asm_elementwise(_DEQUANT, "=r,=r,=r,=r,r,r", [words, nzz],
                                                       dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True,
                                                       pack=1)
            acc0 += s * tl.sum(_row_sum(X, 0, kp, kp_mask, d0, d1, d2, d3, EVEN_K), axis=0)
            if ROWS > 1:
                acc1 += s * tl.sum(_row_sum(X, r1, kp, kp_mask, d0, d1, d2, d3, EVEN_K), axis=0)
            if ROWS > 2:
                acc2 += s * tl.sum(_row_sum(X, r2, kp, kp_mask, d0, d1, d2, d3, EVEN_K), axis=0)
                acc3 += s * tl.sum(_row_sum(X, r3, kp, kp_mask, d0, d1, d2, d3, EVEN_K), axis=0)
        else:
            acc0 += s * tl.sum(_row_sum_emulated(X, 0, kp, kp_mask, words, z), axis=0)
            if ROWS > 1:
                acc1 += s * tl.sum(_row_sum_emulated(X, r1, kp, kp_mask, words, z), axis=0)
            if ROWS > 2:
                acc2 += s * tl.sum(_row_sum_emulated(X, r2, kp, kp_mask, words, z), axis=0)
                acc3 += s * tl.sum(_row_sum_emulated(X, r3, kp, kp_mask, words, z), axis=0)
    store_rows(Y, Bias, offs_n, n_mask, pid_k, M, stride_ym, stride_ys, acc0, acc1, acc2, acc3, ROWS, HAS_BIAS, SPLIT)
    if SPLIT and FUSED:
        _reduce_in_kernel(Y, Out, Bias, Cnt, offs_n, n_mask, pid_n, M, stride_ym, stride_ys, stride_om, splits, ROWS,
                          HAS_BIAS, SPLIT_P2)
