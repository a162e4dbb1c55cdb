"""What the few-row kernels (fp8_gemv.py, int4_skinny.py) share: the activations read as int64 words of four 16-bit
values (one load a word, widened to float32 exactly by shifts), the fused prologue on them (gemm/fused_steps.py's
steps on words: fp8_gemv.py at one row), and the output rows' store (Triton)."""
from __future__ import annotations

import triton
import triton.language as tl

from radixlm.runtime.kernels.gemm.fused_steps import prologue_values


@triton.jit
def widen_word(w, XKIND: tl.constexpr):
    """The four values of int64 words w as float32 tensors; XKIND 0: bfloat16, 1: float16."""
    lo = w.to(tl.int32)
    hi = (w >> 32).to(tl.int32)
    if XKIND == 0:
        x0 = (lo << 16).to(tl.float32, bitcast=True)
        x1 = (lo & -65536).to(tl.float32, bitcast=True)
        x2 = (hi << 16).to(tl.float32, bitcast=True)
        x3 = (hi & -65536).to(tl.float32, bitcast=True)
    else:
        x0 = lo.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        x1 = (lo >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        x2 = hi.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        x3 = (hi >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return x0, x1, x2, x3


@triton.jit
def x_quarters(X, row, i, i_mask, k_end, XKIND: tl.constexpr, EVEN_K: tl.constexpr):
    """x[row, 4 i + j] for j = 0..3 as float32 [BLOCK_K / 4] tensors, in the weight words' layout. XKIND 0 / 1: X
    holds bfloat16 / float16 as int64 words of four (one load a word; widened by shifts, exactly); 2: float32
    (strided loads: the interpreter)."""
    if XKIND == 2:
        m = (4 * i < k_end) if not EVEN_K else (i >= 0)
        x0 = tl.load(X + row + 4 * i, mask=m, other=0.0)
        x1 = tl.load(X + row + 4 * i + 1, mask=m, other=0.0)
        x2 = tl.load(X + row + 4 * i + 2, mask=m, other=0.0)
        x3 = tl.load(X + row + 4 * i + 3, mask=m, other=0.0)
    else:
        if EVEN_K:
            xw = tl.load(X + row + i)
        else:
            xw = tl.load(X + row + i, mask=i_mask, other=0)
        x0, x1, x2, x3 = widen_word(xw, XKIND)
    return x0, x1, x2, x3


@triton.jit
def act_value(v, XKIND: tl.constexpr):
    """float32 quarters in the activation dtype (exact where they were widened from it)."""
    if XKIND == 0:
        v = v.to(tl.bfloat16)
    elif XKIND == 1:
        v = v.to(tl.float16)
    return v


@triton.jit
def _half_bits(v):
    return v.to(tl.int16, bitcast=True).to(tl.int64) & 0xFFFF


@triton.jit
def _store_quarters(P, i, mask, v0, v1, v2, v3, XKIND: tl.constexpr):
    """Quarters in the activation dtype stored where x_quarters(P, 0, i, ...) loads them."""
    if XKIND == 2:
        tl.store(P + 4 * i, v0, mask=mask)
        tl.store(P + 4 * i + 1, v1, mask=mask)
        tl.store(P + 4 * i + 2, v2, mask=mask)
        tl.store(P + 4 * i + 3, v3, mask=mask)
    else:
        tl.store(P + i, _half_bits(v0) | (_half_bits(v1) << 16) | (_half_bits(v2) << 32) | (_half_bits(v3) << 48),
                 mask=mask)


@triton.jit
def inv_rms_words(X, R, K, eps, PRO: tl.constexpr, XKIND: tl.constexpr, BLOCK_I: tl.constexpr):
    """fused_steps.inv_rms on row 0 read as x_quarters reads it, BLOCK_I words a step."""
    acc = tl.zeros([BLOCK_I], dtype=tl.float32)
    for i0 in range(0, K // 4, BLOCK_I):
        i = i0 + tl.arange(0, BLOCK_I)
        m = i < K // 4
        x0, x1, x2, x3 = x_quarters(X, 0, i, m, K, XKIND, False)
        if PRO == 2:
            r0, r1, r2, r3 = x_quarters(R, 0, i, m, K, XKIND, False)
            x0 = act_value(x0 + r0, XKIND).to(tl.float32)
            x1 = act_value(x1 + r1, XKIND).to(tl.float32)
            x2 = act_value(x2 + r2, XKIND).to(tl.float32)
            x3 = act_value(x3 + r3, XKIND).to(tl.float32)
        acc += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
    return 1.0 / tl.sqrt(tl.sum(acc, axis=0) / K + eps)


@triton.jit
def prologue_quarters(X, R, NW, RO, i, i_mask, k_end, K, inv, res_mask, x0, x1, x2, x3, PRO: tl.constexpr,
                      XKIND: tl.constexpr, EVEN_K: tl.constexpr):
    """Row 0's quarters x0..x3 through the prologue (fused_steps.prologue_values); PRO 2 stores x + residual at RO
    where res_mask (program column 0)."""
    if PRO == 3:
        up = K // 4  # [gate | up]: up's offset in X's units
        if XKIND == 2:
            up = K
        u0, u1, u2, u3 = x_quarters(X, up, i, i_mask, k_end, XKIND, EVEN_K)
        x0, g0 = prologue_values(act_value(x0, XKIND), u0, u0, inv, PRO)
        x1, g1 = prologue_values(act_value(x1, XKIND), u1, u1, inv, PRO)
        x2, g2 = prologue_values(act_value(x2, XKIND), u2, u2, inv, PRO)
        x3, g3 = prologue_values(act_value(x3, XKIND), u3, u3, inv, PRO)
    else:
        w0, w1, w2, w3 = x_quarters(NW, 0, i, i_mask, k_end, XKIND, EVEN_K)
        r0, r1, r2, r3 = w0, w1, w2, w3  # unread: RMSNORM has no residual
        if PRO == 2:
            r0, r1, r2, r3 = x_quarters(R, 0, i, i_mask, k_end, XKIND, EVEN_K)
        x0, s0 = prologue_values(act_value(x0, XKIND), r0, w0, inv, PRO)
        x1, s1 = prologue_values(act_value(x1, XKIND), r1, w1, inv, PRO)
        x2, s2 = prologue_values(act_value(x2, XKIND), r2, w2, inv, PRO)
        x3, s3 = prologue_values(act_value(x3, XKIND), r3, w3, inv, PRO)
        if PRO == 2:
            _store_quarters(RO, i, res_mask, s0, s1, s2, s3, XKIND)
    return x0, x1, x2, x3


@triton.jit
def store_rows(Y, Bias, offs_n, n_mask, pid_k, M, stride_ym, stride_ys, y0, y1, y2, y3, ROWS: tl.constexpr,
               HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """Rows 0..ROWS-1 (1, 2 or 4; row r only where r < M) of a program's output tile from its float32 row sums y0..y3,
    plus the bias; a split-K program writes its partial (no bias) to its own slice pid_k of Y."""
    if HAS_BIAS and not SPLIT:
        b = tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        b = tl.zeros_like(offs_n).to(tl.float32)
    if SPLIT:
        out = Y + pid_k * stride_ys + offs_n
    else:
        out = Y + offs_n
    tl.store(out, (y0 + b).to(Y.dtype.element_ty), mask=n_mask)
    if ROWS > 1:
        tl.store(out + stride_ym, (y1 + b).to(Y.dtype.element_ty), mask=n_mask & (offs_n * 0 + 1 < M))
    if ROWS > 2:
        tl.store(out + 2 * stride_ym, (y2 + b).to(Y.dtype.element_ty), mask=n_mask & (offs_n * 0 + 2 < M))
        tl.store(out + 3 * stride_ym, (y3 + b).to(Y.dtype.element_ty), mask=n_mask & (offs_n * 0 + 3 < M))
