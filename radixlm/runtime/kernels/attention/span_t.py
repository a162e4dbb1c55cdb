"""attend_span's walk with the products transposed (DecodeKernelConfig.swapped): S^T = K Q^T and O^T = V^T P, so the
block's positions are the tensor-core product's long side (M = BLOCK_N) and the few query rows its short one.
Triton (3.9, sm_90) then runs both dots on Hopper's warpgroup MMA (wgmma needs M >= 64; the 16-row product of
span.py runs on the older mma.sync), and over an e4m3 pool widened to halves (span.kv_qk_fp8) the query, quantized
to e4m3 per row by the kernel, meets K as stored on the FP8 tensor cores: K is not widened at all (V is, for P V in
halves). What FlashAttention-3 and vLLM do with an FP8 cache (they quantize P too): the scores carry the query's
e4m3 rounding (3 mantissa bits)."""
from __future__ import annotations

import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.span import _gather, _like


@triton.jit
def _block_t(q, k, v, n_mask, m_i, l_i, acc_t, sm_rows, PRECISION: tl.constexpr, KV_CVT: tl.constexpr):
    """One block of the online softmax over acc_t (BLOCK_D, rows). An e4m3 q takes K as stored and P V in halves;
    otherwise K and V in q's dtype (span._like). sm_rows: each row's softmax scale."""
    if q.dtype.is_fp8():
        s_t = tl.dot(k, tl.trans(q)).to(tl.float32)
        pv = tl.float16
    else:
        s_t = tl.dot(_like(k, q, KV_CVT), tl.trans(q), input_precision=PRECISION).to(tl.float32)
        pv = q.dtype
    s_t = tl.where(n_mask[:, None], s_t * sm_rows[None, :], float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s_t, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s_t - m_new[None, :])
    p_dot = p.to(pv)
    acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(_like(v, p_dot, KV_CVT)), p_dot,
                                            input_precision=PRECISION).to(tl.float32)
    l_i = l_i * alpha + tl.sum(p, 0)
    return m_new, l_i, acc_t


@triton.jit
def attend_span_t(q, K_buf, V_buf, Table, start, end, kvh, sm_rows, v_scale, stride_kbs, stride_kh, stride_vbs,
                  stride_vh, offs_d, d_mask, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr, PREFETCH: tl.constexpr, KV_CVT: tl.constexpr):
    """span.attend_span's result (the normalized output (rows, BLOCK_D) and its log-sum-exp) by the transposed
    products; sm_rows (rows,) each row's softmax scale. PREFETCH 1: the table a block ahead, as attend_span's."""
    m_i = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_D, BLOCK_ROWS], dtype=tl.float32)
    if PREFETCH == 1:
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(Table + offs_n, mask=n_mask, other=0)
        for n0 in range(start, end, BLOCK_N):
            k = _gather(K_buf, slots, kvh, stride_kbs, stride_kh, offs_d, n_mask, d_mask)
            v = _gather(V_buf, slots, kvh, stride_vbs, stride_vh, offs_d, n_mask, d_mask)
            next_n = n0 + BLOCK_N + tl.arange(0, BLOCK_N)
            next_mask = next_n < end
            next_slots = tl.load(Table + next_n, mask=next_mask, other=0)
            m_i, l_i, acc_t = _block_t(q, k, v, n_mask, m_i, l_i, acc_t, sm_rows, PRECISION, KV_CVT)
            slots, n_mask = next_slots, next_mask
    else:
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n < end
            slots = tl.load(Table + offs_n, mask=n_mask, other=0)
            k = _gather(K_buf, slots, kvh, stride_kbs, stride_kh, offs_d, n_mask, d_mask)
            v = _gather(V_buf, slots, kvh, stride_vbs, stride_vh, offs_d, n_mask, d_mask)
            m_i, l_i, acc_t = _block_t(q, k, v, n_mask, m_i, l_i, acc_t, sm_rows, PRECISION, KV_CVT)
    out = tl.trans(acc_t / tl.where(l_i > 0, l_i, 1.0)[None, :] * v_scale)
    lse = tl.where(end > start, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    return out, lse
