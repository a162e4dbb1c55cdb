"""MLA decode over the latent KV pool (layout and scores: mla.py): one query token per request, split-K in two stages.

Stage 1: program (head block, request, split) walks its split of the request's positions in blocks of BLOCK_N,
gathers each block's latents through req_to_token once, and scores BLOCK_H heads against them (q_nope . c_kv +
q_pe . k_pe) and accumulates the same latents, weighted, as the values: an online softmax in base 2 (sm_scale carries
log2(e)). It writes a partial output and its log-sum-exp (base 2) per split, or with one split the output itself
(DIRECT: no stage 2). Stage 2: program (request, head) merges the splits, MLA_STAGE2_BLOCK_S at a time. The head
block is the grid's fastest axis: the head blocks of one request run together and share its latents in L2.

A request's splits are equal runs of whole blocks, ceil(seq_len / splits) rounded up to BLOCK_N, computed on the
device from Seq_lens: a CUDA graph replays any lengths at its fixed split count. Splits past a short sequence's end
are empty: log-sum-exp -inf, never read."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.mla import (
    MLA_STAGE2_BLOCK_S, MlaDecodeConfig, check_mla_args, mla_decode_config, mla_decode_num_splits)
from radixlm.runtime.kernels.attention.span import _like as like_q  # (the packed float8 conversion)
from radixlm.runtime.kernels.attention.span import kv_convert_asm

LOG2E = 1 / math.log(2)
# Index vectors are views at any offset (decode.py's INDEX_ARGS); the split count and the log-sum-exps' strides that
# follow it are runtime values (a graph's split count, or an eager pass's), never specialized (decode.py's SPLIT_ARGS).
INDEX_ARGS = ["Req_pool_indices", "Seq_lens"]
SPLIT_ARGS = ["num_splits", "stride_mlb", "stride_mlh"]


@triton.jit
def mla_block(q_nope, q_pe, acc, m_i, l_i, KV, slots, n_mask, visible, stride_kv, offs_r, r_mask, offs_p, p_mask,
              sm_scale, R: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr, KV_CVT: tl.constexpr):
    """One block of BLOCK_N slots into the online softmax of q's rows: the latents are loaded once and serve as the
    keys' first R values and as the values. n_mask: the block's positions in range (others load zeros: a padding
    slot's values never reach the sums); `visible` ([rows or 1, BLOCK_N]): which keys each row sees (MASKED). A
    float8 pool converts in registers where it was loaded (span.like_q: KV_CVT, the inline conversion on CUDA)."""
    kv_rows = KV + slots.to(tl.int64)[:, None] * stride_kv
    latent = like_q(tl.load(kv_rows + offs_r[None, :], mask=n_mask[:, None] & r_mask[None, :], other=0.0), q_nope,
                    KV_CVT)
    rope = like_q(tl.load(kv_rows + R + offs_p[None, :], mask=n_mask[:, None] & p_mask[None, :], other=0.0), q_pe,
                  KV_CVT)
    s = tl.dot(q_nope, tl.trans(latent), input_precision=PRECISION)
    s = tl.dot(q_pe, tl.trans(rope), s, input_precision=PRECISION) * sm_scale
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:  # a row that has seen no key yet (a tree mask's) keeps m_i = -inf and adds nothing
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    else:
        m_ref = m_new
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(latent.dtype), latent, input_precision=PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit(do_not_specialize=SPLIT_ARGS, do_not_specialize_on_alignment=INDEX_ARGS)
def _mla_decode_stage1(
    Q, KV, Req_to_token, Req_pool_indices, Seq_lens, Mid_o, Mid_lse, O, sm_scale, out_scale,
    stride_qb, stride_qh, stride_kv, stride_rt, stride_mob, stride_moh, stride_mlb, stride_mlh, stride_ob, stride_oh,
    num_splits, NUM_HEADS: tl.constexpr, R: tl.constexpr, P: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    DIRECT: tl.constexpr, KV_CVT: tl.constexpr,
):
    hb = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(Seq_lens + b).to(tl.int32)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    table = Req_to_token + tl.load(Req_pool_indices + b).to(tl.int64) * stride_rt

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < NUM_HEADS
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    r_mask = offs_r < R
    p_mask = offs_p < P
    q_rows = Q + b * stride_qb + heads[:, None] * stride_qh
    q_nope = tl.load(q_rows + offs_r[None, :], mask=h_mask[:, None] & r_mask[None, :], other=0.0)
    q_pe = tl.load(q_rows + R + offs_p[None, :], mask=h_mask[:, None] & p_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(table + offs_n, mask=n_mask, other=0)
        acc, m_i, l_i = mla_block(q_nope, q_pe, acc, m_i, l_i, KV, slots, n_mask, n_mask[None, :], stride_kv, offs_r,
                                  r_mask, offs_p, p_mask, sm_scale, R=R, PRECISION=PRECISION, MASKED=True,
                                  KV_CVT=KV_CVT)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * out_scale
    if DIRECT:
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_r[None, :], out.to(O.dtype.element_ty),
                 mask=h_mask[:, None] & r_mask[None, :])
    else:
        tl.store(Mid_o + b * stride_mob + heads[:, None] * stride_moh + split * R + offs_r[None, :], out,
                 mask=h_mask[:, None] & r_mask[None, :])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(Mid_lse + b * stride_mlb + heads * stride_mlh + split, lse, mask=h_mask)


@triton.jit(do_not_specialize=SPLIT_ARGS)
def _mla_decode_stage2(
    Mid_o, Mid_lse, O, stride_mob, stride_moh, stride_mlb, stride_mlh, stride_ob, stride_oh, num_splits,
    R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < R
    m = float("-inf")
    den = 0.0
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_mask = offs_s < num_splits
        lse = tl.load(Mid_lse + b * stride_mlb + h * stride_mlh + offs_s, mask=s_mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # no split with positions yet: nothing to rescale
        kept = lse > float("-inf")
        w = tl.where(kept, tl.exp2(lse - m_ref), 0.0)
        parts = tl.load(Mid_o + b * stride_mob + h * stride_moh + offs_s[:, None] * R + offs_r[None, :],
                        mask=kept[:, None] & r_mask[None, :], other=0.0)
        scale = tl.exp2(m - m_ref)
        acc = acc * scale + tl.sum(parts * w[:, None], 0)
        den = den * scale + tl.sum(w, 0)
        m = m_new
    out = acc / tl.where(den > 0, den, 1.0)  # a request of no positions (a padded row of length 0): zeros
    tl.store(O + b * stride_ob + h * stride_oh + offs_r, out.to(O.dtype.element_ty), mask=r_mask)


def mla_decode_attention(q: torch.Tensor, kv: torch.Tensor, req_to_token: torch.Tensor,
                         req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, out: torch.Tensor,
                         num_kv_splits: int | None = None, max_seq_len: int | None = None, kv_scale: float = 1.0,
                         config: MlaDecodeConfig | None = None) -> torch.Tensor:
    """q: (bs, H, R + P) absorbed queries; kv: (slots, 1, R + P) the layer's latent pool; out: (bs, H, R), written
    and returned. num_kv_splits: fixed per CUDA graph (else mla_decode_num_splits of bs, H and the host's
    max_seq_len hint). kv_scale: a float8 pool's layer scale (scores and values are stored * kv_scale). No device
    sync: every length is read on the device."""
    rank, rope = check_mla_args(q, kv, out)
    bs, num_heads = q.shape[0], q.shape[1]
    if req_pool_indices.shape != (bs,) or seq_lens.shape != (bs,):
        raise ValueError(f"mla_decode: req_pool_indices and seq_lens of shape ({bs},), got "
                         f"{tuple(req_pool_indices.shape)}, {tuple(seq_lens.shape)}")
    if req_to_token.dim() != 2 or req_to_token.stride(1) != 1:
        raise ValueError(f"mla_decode: req_to_token (rows, positions) contiguous by position, got "
                         f"{tuple(req_to_token.shape)}")
    config = config or mla_decode_config(num_heads)
    splits = num_kv_splits if num_kv_splits is not None else mla_decode_num_splits(
        max(bs, 1), num_heads, max_seq_len, config)
    if not isinstance(splits, int) or splits < 1:
        raise ValueError(f"mla_decode: num_kv_splits >= 1, got {splits!r}")
    if bs == 0:
        return out
    direct = splits == 1
    if not direct and bs * num_heads * splits * rank >= 2**31:  # the partials' offsets are 32-bit
        raise ValueError(f"mla_decode: {splits} splits of {bs} x {num_heads} heads exceed 2^31 partial values; "
                         f"use fewer splits (mla_decode_num_splits)")
    if direct:  # no partials: the output stands in for their pointers (DIRECT never reads them)
        mid_o, mid_lse, mid = out, out, (0, 0, 0, 0)
    else:
        mid_o = torch.empty(bs, num_heads, splits, rank, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(bs, num_heads, splits, dtype=torch.float32, device=q.device)
        mid = (mid_o.stride(0), mid_o.stride(1), mid_lse.stride(0), mid_lse.stride(1))
    block_r, block_p = triton.next_power_of_2(rank), triton.next_power_of_2(rope)
    _mla_decode_stage1[(triton.cdiv(num_heads, config.block_h), bs, splits)](
        q, kv, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse, out, float(sm_scale * kv_scale * LOG2E),
        float(kv_scale), q.stride(0), q.stride(1), kv.stride(0), req_to_token.stride(0), *mid, out.stride(0),
        out.stride(1), splits, NUM_HEADS=num_heads, R=rank, P=rope, BLOCK_R=block_r, BLOCK_P=block_p,
        BLOCK_H=config.block_h, BLOCK_N=config.block_n, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        DIRECT=direct, KV_CVT=kv_convert_asm(kv.dtype, q.dtype, q.device) if config.inline_cvt else "",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if not direct:
        _mla_decode_stage2[(bs, num_heads)](
            mid_o, mid_lse, out, *mid, out.stride(0), out.stride(1), splits, R=rank, BLOCK_R=block_r,
            BLOCK_S=MLA_STAGE2_BLOCK_S, num_warps=4,
        )
    return out
