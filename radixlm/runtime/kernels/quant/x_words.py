"""The few-row kernels' activations read as int64 words of four 16-bit values (fp8_gemv.py, int4_skinny.py): one load
a word, widened to float32 exactly by shifts (Triton)."""
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
