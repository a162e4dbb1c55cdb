"""What the few-row kernels (fp8_gemv.py, int4_skinny.py) share: the activations read as int64 words of four 16-bit
values (one load a word, widened to float32 exactly by shifts), and the output rows' store (Triton)."""
from __future__ import annotations

import triton
import triton.language as tl


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
