"""The online-softmax walk over a span of one request's KV that the decode kernels share (decode.py's stage 1,
shared_prefix.py's prefix stage)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_span(q, K_buf, V_buf, Table, start, end, kvh, sm_scale, v_scale, stride_kbs, stride_kh, stride_vbs,
                stride_vh, offs_d, d_mask, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                PRECISION: tl.constexpr):
    """Attention of q's BLOCK_ROWS query rows to positions [start, end) of one request's table (its req_to_token
    row), K/V of kv head kvh gathered BLOCK_N positions at a time with an online softmax: the normalized output
    and its log-sum-exp (-inf where the span is empty). K and V are read in q's dtype (a float8 pool's converted);
    the pool's scales enter as sm_scale (already times k_scale) and v_scale (times the output)."""
    m_i = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    acc = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(Table + offs_n, mask=n_mask, other=0)
        k = tl.load(K_buf + slots[:, None] * stride_kbs + kvh * stride_kh + offs_d[None, :],
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k).to(q.dtype), input_precision=PRECISION).to(tl.float32) * sm_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(V_buf + slots[:, None] * stride_vbs + kvh * stride_vh + offs_d[None, :],
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * v_scale
    lse = tl.where(end > start, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    return out, lse
