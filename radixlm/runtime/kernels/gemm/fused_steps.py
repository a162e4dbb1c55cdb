"""The device code of the steps a GEMM kernel fuses: the prologue before it (prologue.py: RMSNorm, with the residual
add, or SiLU-and-mul, on the GEMM's input loads) and the epilogue after it (epilogue.py: the qkv GEMM's rotary
embedding and KV store on its output). Shared by the bf16 skinny kernel (skinny_gemm.py) and the FP8 few-row kernel
(quant/fp8_gemv.py); each rounds where the unfused kernels (elementwise.fused_kernels) round."""
from __future__ import annotations

import triton
import triton.language as tl

from radixlm.runtime.kernels.elementwise import kv_cache_value, rotate_halves, silu_mul


@triton.jit
def inv_rms(X, R, K, eps, PRO: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / rms of one row x (PRO 2: of x + residual, rounded to x's dtype), read from L2 in BLOCK_K-wide steps."""
    acc = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + k, mask=k < K, other=0.0)
        if PRO == 2:
            x = (x.to(tl.float32) + tl.load(R + k, mask=k < K, other=0.0).to(tl.float32)).to(x.dtype)
        h = x.to(tl.float32)
        acc += h * h
    return 1.0 / tl.sqrt(tl.sum(acc, axis=0) / K + eps)


@triton.jit
def prologue_values(x, r, nw, inv, PRO: tl.constexpr):
    """The GEMM's inputs from the step's, x in the activation dtype: PRO 1 nw * norm(x), 2 the same of x + r (the
    residual), 3 silu(x) * r (r: up); each rounded to the dtype where the unfused kernels round, returned in float32,
    with x + r rounded (PRO 2: the new residual; else x)."""
    if PRO == 3:
        y = silu_mul(x, r.to(tl.float32)).to(x.dtype).to(tl.float32)
    else:
        if PRO == 2:
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        normed = (x.to(tl.float32) * inv).to(x.dtype).to(tl.float32)
        y = (nw.to(tl.float32) * normed).to(x.dtype).to(tl.float32)
    return y, x


@triton.jit
def epilogue_columns(pid, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program pid's output columns under an epilogue: BLOCK_N // 2 dims j0.. of head head0's first half and the same
    dims of its second half (the rotation's pairs); returns (columns, head0, j0)."""
    per_head = HEAD_DIM // BLOCK_N
    head0 = (pid // per_head) * HEAD_DIM
    j0 = (pid % per_head) * (BLOCK_N // 2)
    i = tl.arange(0, BLOCK_N)
    return head0 + tl.where(i < BLOCK_N // 2, j0 + i, HEAD_DIM // 2 + j0 + i - BLOCK_N // 2), head0, j0


@triton.jit
def rotary_store(y, Y, offs_n, head0, j0, Pos, CosSin, Loc, KBuf, VBuf, n_q, n_kv, stride_cs, stride_kb, stride_vb,
                 k_scale, v_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """The epilogue on one row's outputs y (in the output dtype; columns from epilogue_columns): q and k rotated as
    the rotary kernel rotates them (the calling kernels keep fp fusion), stored at Y; k and v also at the token's
    KV slot."""
    if head0 < n_q + n_kv:
        y1, y2 = tl.split(tl.permute(tl.reshape(y, [2, BLOCK_N // 2]), (1, 0)))
        cs = CosSin + tl.load(Pos) * stride_cs + j0 + tl.arange(0, BLOCK_N // 2)
        o1, o2 = rotate_halves(y1, y2, tl.load(cs), tl.load(cs + HEAD_DIM // 2), True)
        y = tl.reshape(tl.permute(tl.join(o1, o2), (1, 0)), [BLOCK_N])
    tl.store(Y + offs_n, y)
    slot = tl.load(Loc).to(tl.int64)
    if head0 >= n_q + n_kv:
        tl.store(VBuf + slot * stride_vb + offs_n - n_q - n_kv, kv_cache_value(y, v_scale, VBuf))
    elif head0 >= n_q:
        tl.store(KBuf + slot * stride_kb + offs_n - n_q, kv_cache_value(y, k_scale, KBuf))
