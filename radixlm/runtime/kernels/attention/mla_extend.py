"""MLA extend over the latent KV pool (layout and scores: mla.py): each request's new tokens attend to its cached
prefix and, causally, to each other; the new tokens' latents are already in the pool, so every key is read through
req_to_token (extend.py's conventions: prefix_lens, extend_lens, extend_start_loc, and its work list of (request,
block of new tokens) entries, extend_blocks.py at the config's block_m).

Program (head block, entry): its query rows are BLOCK_M new tokens x BLOCK_H heads, row r being token r // BLOCK_H
and head r % BLOCK_H of the block, so one load of a block of latents serves every head and token of the program (MQA).
New token j sits at position prefix + j and sees positions <= prefix + j: the key blocks wholly before the program's
first token are walked without the causal mask, the rest with it. The head block is the grid's fastest axis.

Custom masks (tree drafts, spec/tree.TreeMask; USE_CUSTOM_MASK, a constexpr) as extend.py's: a request with mask
offset o >= 0 and mask start s has its new token j see every key at table index < s and index s + c (c < seq_len -
s) where Mask[o + j * (seq_len - s) + c] is nonzero; offset -1 stays causal. A masked request's key loop runs to
seq_len."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.mla import (
    MlaExtendConfig, check_mla_args, mla_extend_blocks, mla_extend_config)
from radixlm.runtime.kernels.attention.mla_decode import mla_block
from radixlm.runtime.kernels.attention.span import kv_convert_asm

LOG2E = 1 / math.log(2)
INDEX_ARGS = ["Req_pool_indices", "Prefix_lens", "Extend_lens", "Extend_starts", "Blocks", "Mask", "Mask_starts",
              "Mask_offsets"]  # views at any offset


@triton.jit(do_not_specialize_on_alignment=INDEX_ARGS)
def _mla_extend_kernel(
    Q, KV, O, Req_to_token, Req_pool_indices, Prefix_lens, Extend_lens, Extend_starts, Blocks, sm_scale, out_scale,
    stride_qt, stride_qh, stride_kv, stride_ot, stride_oh, stride_rt, Mask, Mask_starts, Mask_offsets,
    NUM_HEADS: tl.constexpr, R: tl.constexpr, P: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    KV_CVT: tl.constexpr, USE_CUSTOM_MASK: tl.constexpr,
):
    hb = tl.program_id(0)
    entry = tl.program_id(1)
    b = tl.load(Blocks + 2 * entry)
    mblock = tl.load(Blocks + 2 * entry + 1)
    ext = tl.load(Extend_lens + b)
    if mblock * BLOCK_M >= ext:  # an entry past the request's new tokens (a graph's padded list) writes nothing
        return
    prefix = tl.load(Prefix_lens + b)
    start = tl.load(Extend_starts + b)
    table = Req_to_token + tl.load(Req_pool_indices + b).to(tl.int64) * stride_rt

    offs = tl.arange(0, BLOCK_M * BLOCK_H)
    tok = mblock * BLOCK_M + offs // BLOCK_H
    heads = hb * BLOCK_H + offs % BLOCK_H
    row_mask = (tok < ext) & (heads < NUM_HEADS)
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    r_mask = offs_r < R
    p_mask = offs_p < P
    q_rows = Q + (start + tok).to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh
    q_nope = tl.load(q_rows + offs_r[None, :], mask=row_mask[:, None] & r_mask[None, :], other=0.0)
    q_pe = tl.load(q_rows + R + offs_p[None, :], mask=row_mask[:, None] & p_mask[None, :], other=0.0)
    q_pos = prefix + tok

    m_i = tl.full([BLOCK_M * BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_H, BLOCK_R], dtype=tl.float32)
    key_end = prefix + tl.minimum((mblock + 1) * BLOCK_M, ext)
    if USE_CUSTOM_MASK:
        mask_off = tl.load(Mask_offsets + b)
        has_mask = mask_off >= 0
        mask_start = tl.where(has_mask, tl.load(Mask_starts + b), prefix + ext)  # causal rows: no mask columns
        mask_width = prefix + ext - mask_start
        key_end = tl.where(has_mask, prefix + ext, key_end)
        first = key_end * 0
    else:
        # Every row sees every key before the program's first token (and key `first` after it).
        first = (prefix + mblock * BLOCK_M) // BLOCK_N * BLOCK_N
        for n0 in range(0, first, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            slots = tl.load(table + offs_n)
            acc, m_i, l_i = mla_block(q_nope, q_pe, acc, m_i, l_i, KV, slots, offs_n < first, None, stride_kv,
                                      offs_r, r_mask, offs_p, p_mask, sm_scale, R=R, PRECISION=PRECISION,
                                      MASKED=False, KV_CVT=KV_CVT)
    for n0 in range(first, key_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < key_end
        slots = tl.load(table + offs_n, mask=n_mask, other=0)
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if USE_CUSTOM_MASK:
            col = offs_n - mask_start
            in_mask = (col >= 0) & n_mask
            bits = tl.load(Mask + mask_off + tok[:, None] * mask_width + col[None, :],
                           mask=row_mask[:, None] & in_mask[None, :], other=0)
            visible = tl.where(has_mask, n_mask[None, :] & ((col[None, :] < 0) | (bits != 0)), visible)
        acc, m_i, l_i = mla_block(q_nope, q_pe, acc, m_i, l_i, KV, slots, n_mask, visible, stride_kv, offs_r,
                                  r_mask, offs_p, p_mask, sm_scale, R=R, PRECISION=PRECISION, MASKED=True,
                                  KV_CVT=KV_CVT)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * out_scale
    tl.store(O + (start + tok).to(tl.int64)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_r[None, :],
             out.to(O.dtype.element_ty), mask=row_mask[:, None] & r_mask[None, :])


def mla_extend_attention(q: torch.Tensor, kv: torch.Tensor, req_to_token: torch.Tensor,
                         req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                         extend_start_loc: torch.Tensor, sm_scale: float, out: torch.Tensor,
                         blocks: torch.Tensor | None = None, kv_scale: float = 1.0,
                         config: MlaExtendConfig | None = None, custom_mask: torch.Tensor | None = None,
                         mask_starts: torch.Tensor | None = None,
                         mask_offsets: torch.Tensor | None = None) -> torch.Tensor:
    """q: (num_new_tokens, H, R + P) absorbed queries, request-major (request i's from extend_start_loc[i]); kv:
    (slots, 1, R + P), the new tokens' latents already stored; out: (num_new_tokens, H, R), written and returned.
    blocks: the work list on the device (mla.mla_extend_blocks at `config`, int64); without it, built here from
    extend_lens (a device sync: eager passes only). kv_scale: a float8 pool's layer scale. custom_mask (uint8 or
    bool, each masked request's mask flattened row-major, concatenated), mask_starts and mask_offsets (per request;
    offset -1: causal): tree drafts, as the module's docstring says."""
    rank, rope = check_mla_args(q, kv, out)
    bs = req_pool_indices.shape[0]
    for name, t in (("prefix_lens", prefix_lens), ("extend_lens", extend_lens),
                    ("extend_start_loc", extend_start_loc)):
        if t.shape != (bs,):
            raise ValueError(f"mla_extend: {name} of shape ({bs},) like req_pool_indices, got {tuple(t.shape)}")
    if req_to_token.dim() != 2 or req_to_token.stride(1) != 1:
        raise ValueError(f"mla_extend: req_to_token (rows, positions) contiguous by position, got "
                         f"{tuple(req_to_token.shape)}")
    num_heads = q.shape[1]
    config = config or mla_extend_config(num_heads)
    if blocks is None:
        blocks = torch.tensor(mla_extend_blocks(extend_lens.tolist(), config), dtype=torch.int64, device=q.device)
    if blocks.dim() != 1 or blocks.numel() % 2:
        raise ValueError(f"mla_extend: blocks is a flat list of (request, block) pairs, got {tuple(blocks.shape)}")
    if blocks.numel() == 0 or q.shape[0] == 0:
        return out
    use_mask = custom_mask is not None
    if use_mask:
        if mask_starts is None or mask_offsets is None or mask_starts.shape != (bs,) or mask_offsets.shape != (bs,):
            raise ValueError("mla_extend: a custom_mask takes mask_starts and mask_offsets of one entry a request")
        if custom_mask.dtype == torch.bool:
            custom_mask = custom_mask.view(torch.uint8)
    _mla_extend_kernel[(triton.cdiv(num_heads, config.block_h), blocks.numel() // 2)](
        q, kv, out, req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_start_loc, blocks,
        float(sm_scale * kv_scale * LOG2E), float(kv_scale), q.stride(0), q.stride(1), kv.stride(0), out.stride(0),
        out.stride(1), req_to_token.stride(0), custom_mask, mask_starts if use_mask else None,
        mask_offsets if use_mask else None, NUM_HEADS=num_heads, R=rank, P=rope,
        BLOCK_R=triton.next_power_of_2(rank), BLOCK_P=triton.next_power_of_2(rope), BLOCK_H=config.block_h,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_CVT=kv_convert_asm(kv.dtype, q.dtype, q.device) if config.inline_cvt else "",
        USE_CUSTOM_MASK=use_mask, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
