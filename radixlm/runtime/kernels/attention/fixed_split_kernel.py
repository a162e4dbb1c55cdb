"""Batch-invariant attention's Triton kernel (fixed_split.py describes the rule): program (row, kv head) walks the
row's keys from position 0 in FIXED_SPLIT_SIZE blocks, one tl.dot of one tile shape per block for the scores and one
for the values, merged in an online softmax in position order. Every row of every pass (prefill, chunk, extend over a
cached prefix, decode, a CUDA-graph replay) runs this one walk, so a row's output depends on its own query and keys
only. The GQA group's query heads share the program (padded to BLOCK_H >= 16 rows for tl.dot)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.fixed_split import FIXED_SPLIT_SIZE


# The row vectors are views at any offset (a pass's positions, a graph's static rows).
@triton.jit(do_not_specialize_on_alignment=["Row_req", "Positions"])
def _fixed_split_attention_kernel(Q, K_buf, V_buf, Req_to_token, Row_req, Positions, Out, scale, v_scale,
                                  stride_qt, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ot,
                                  stride_oh, stride_r2t, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    req = tl.load(Row_req + row)
    n = tl.load(Positions + row) + 1
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    h_ok = offs_h < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q = tl.load(Q + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=h_ok[:, None] & d_ok[None, :],
                other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
        pos = start + offs_n
        valid = pos < n
        slot = tl.load(Req_to_token + req * stride_r2t + pos, mask=valid, other=0).to(tl.int64)
        k = tl.load(K_buf + slot[None, :] * stride_kb + kvh * stride_kh + offs_d[:, None],
                    mask=valid[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, k.to(q.dtype)) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V_buf + slot[:, None] * stride_vb + kvh * stride_vh + offs_d[None, :],
                    mask=valid[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
        m_i = m_new
    o = acc / l_i[:, None] * v_scale
    tl.store(Out + row * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], o.to(Out.dtype.element_ty),
             mask=h_ok[:, None] & d_ok[None, :])


def fixed_split_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                          row_req: torch.Tensor, positions: torch.Tensor, scale: float,
                          v_scale: float = 1.0) -> torch.Tensor:
    """As fixed_split.fixed_split_attention_torch, on CUDA: q (T, H, D); returns (T, H, D). The lengths stay on the
    device (nothing here syncs), so a CUDA graph captures it."""
    t, h, d = q.shape
    hkv = k_buf.shape[1]
    if h % hkv:
        raise ValueError(f"{h} query heads do not group over {hkv} kv heads")
    out = torch.empty_like(q)
    if t == 0:
        return out
    group = h // hkv
    _fixed_split_attention_kernel[(t, hkv)](
        q, k_buf, v_buf, req_to_token, row_req, positions, out, scale, v_scale, q.stride(0), q.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), out.stride(0), out.stride(1),
        req_to_token.stride(0), GROUP=group, HEAD_DIM=d, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=triton.next_power_of_2(d), BLOCK_N=FIXED_SPLIT_SIZE, num_warps=4, num_stages=2)
    return out
