"""Extend attention over the paged KV pool: each request's new tokens attend to its cached prefix and, causally,
to each other. The new tokens' K/V are already in the pool, so every key is read through req_to_token.

Program (query head, entry of the work list): an entry names a request and a block of BLOCK_M of its new tokens
(extend_blocks.py: only blocks that hold new tokens). It walks key positions [0, last query position] in blocks
of BLOCK_N with an online softmax; new token j of a request sits at position prefix + j and sees positions
<= prefix + j. The blocks wholly before the query block's first position are walked without the causal mask, then
the rest with it. The query head is the grid's fastest axis, so the heads of one kv head run together and share its
K/V blocks in L2 (on an H100 both changes together: 1.20x on 1024-token prompts, 1.35x on 128 tokens over a
2048-token prefix; benchmarks/results/kernels/h100/extend_attention_sweep.json).

Custom masks (tree drafts, spec/tree.TreeMask; USE_CUSTOM_MASK, a constexpr: passes without masks build
the kernel without this path): a request with mask offset o >= 0 and mask start s replaces the causal rule. Its new
token j sees every key at table index < s, and index s + c (c < seq_len - s) where Mask[o + j * (seq_len - s) + c]
is nonzero: the request's TreeMask.mask flattened row-major, all such requests' masks concatenated (uint8), each
request's offset into it and its start in two device vectors. A request with offset -1 stays causal. The key loop of
a masked request runs to seq_len (a mask may let an earlier row see a later key)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.extend_blocks import extend_block_m, extend_blocks


# Not specialized on the alignment of index vectors (see decode_attention.INDEX_ARGS).
INDEX_ARGS = ["Req_pool_indices", "Prefix_lens", "Extend_lens", "Extend_starts", "Blocks", "Mask", "Mask_starts",
              "Mask_offsets"]


@triton.jit
def _attend_block(q, acc, m_i, l_i, K_buf, V_buf, slots, kv_mask, visible, kvh, sm_scale, stride_kbs, stride_kh,
                  stride_vbs, stride_vh, offs_d, PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """One BLOCK_N block of keys into the online softmax (acc, m_i, l_i); with MASKED, keys not `visible` to a row
    are left out (a row that has seen none yet keeps m_i = -inf)."""
    k = tl.load(K_buf + slots[:, None] * stride_kbs + kvh * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
    # A float8 pool's K and V are read in q's dtype (their scales: k_scale in sm_scale, v_scale on the output).
    s = tl.dot(q, tl.trans(k).to(q.dtype), input_precision=PRECISION).to(tl.float32) * sm_scale
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    else:
        m_ref = m_new
    alpha = tl.exp(m_i - m_ref)
    p = tl.exp(s - m_ref[:, None])
    v = tl.load(V_buf + slots[:, None] * stride_vbs + kvh * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION).to(tl.float32)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit(do_not_specialize_on_alignment=INDEX_ARGS)
def _extend_kernel(
    Q, K_buf, V_buf, O, Req_to_token, Req_pool_indices, Prefix_lens, Extend_lens, Extend_starts, Blocks, sm_scale,
    v_scale, stride_qt, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_ot, stride_oh, stride_rt,
    Mask, Mask_starts, Mask_offsets,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, USE_CUSTOM_MASK: tl.constexpr,
):
    h = tl.program_id(0)
    entry = tl.program_id(1)
    b = tl.load(Blocks + 2 * entry)
    mblock = tl.load(Blocks + 2 * entry + 1)
    ext = tl.load(Extend_lens + b)
    if mblock * BLOCK_M >= ext:  # an entry past the request's new tokens (extend_blocks lists none) writes nothing
        return
    prefix = tl.load(Prefix_lens + b)
    start = tl.load(Extend_starts + b)
    row = tl.load(Req_pool_indices + b)
    kvh = h // GROUP
    table = Req_to_token + row * stride_rt

    offs_m = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < ext
    d_mask = offs_d < HEAD_DIM
    q = tl.load(Q + (start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = prefix + offs_m

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    key_end = prefix + tl.minimum((mblock + 1) * BLOCK_M, ext)
    if USE_CUSTOM_MASK:
        mask_off = tl.load(Mask_offsets + b)
        mask_start = tl.load(Mask_starts + b)
        has_mask = mask_off >= 0
        mask_start = tl.where(has_mask, mask_start, prefix + ext)  # causal rows: no key in the mask's columns
        mask_width = prefix + ext - mask_start
        key_end = tl.where(has_mask, prefix + ext, key_end)
        first = key_end * 0
    else:
        # Every row of the block sees every key before the block's first query position.
        first = (prefix + mblock * BLOCK_M) // BLOCK_N * BLOCK_N
        for n0 in range(0, first, BLOCK_N):
            slots = tl.load(table + n0 + tl.arange(0, BLOCK_N))
            acc, m_i, l_i = _attend_block(q, acc, m_i, l_i, K_buf, V_buf, slots, d_mask[None, :], None, kvh,
                                          sm_scale, stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d,
                                          PRECISION=PRECISION, MASKED=False)
    for n0 in range(first, key_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < key_end
        slots = tl.load(table + offs_n, mask=n_mask, other=0)
        visible = offs_n[None, :] <= q_pos[:, None]
        if USE_CUSTOM_MASK:
            col = offs_n - mask_start
            in_mask = (col >= 0) & n_mask
            bits = tl.load(Mask + mask_off + offs_m[:, None] * mask_width + col[None, :],
                           mask=m_mask[:, None] & in_mask[None, :], other=0)
            visible = tl.where(has_mask, (col[None, :] < 0) | (bits != 0), visible)
        acc, m_i, l_i = _attend_block(q, acc, m_i, l_i, K_buf, V_buf, slots, n_mask[:, None] & d_mask[None, :],
                                      n_mask[None, :] & visible, kvh, sm_scale, stride_kbs, stride_kh, stride_vbs,
                                      stride_vh, offs_d, PRECISION=PRECISION, MASKED=True)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * v_scale
    tl.store(O + (start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=m_mask[:, None] & d_mask[None, :])


def extend_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                     req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                     extend_starts: torch.Tensor, sm_scale: float, max_extend: int,
                     custom_mask: torch.Tensor | None = None, mask_starts: torch.Tensor | None = None,
                     mask_offsets: torch.Tensor | None = None, blocks: torch.Tensor | None = None,
                     k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """q: (num_new_tokens, H, D), request-major; returns (num_new_tokens, H, D) in q's dtype. k_buf, v_buf: in q's
    dtype or float8 (read as stored times k_scale and v_scale: the pool's layer scales). With custom_mask
    (uint8 or bool, flattened per request), mask_starts and mask_offsets (per request; offset -1: causal), the
    masked requests' new tokens see keys as the module's docstring says. blocks: the work list on the device
    (extend_blocks with extend_block_m(max_extend)); without it, built here from the lengths (a device sync)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_buf.shape[1]
    out = torch.empty_like(q)
    block_m = extend_block_m(max_extend)
    if blocks is None:
        flat = extend_blocks(extend_lens.tolist(), block_m)
        blocks = torch.tensor(flat, dtype=torch.int64, device=q.device)  # as the backend's
    if blocks.numel() == 0:
        return out
    grid = (num_heads, blocks.numel() // 2)
    use_mask = custom_mask is not None
    if use_mask and custom_mask.dtype == torch.bool:
        custom_mask = custom_mask.view(torch.uint8)
    # Without a mask its three arguments are None (constexpr None in the launch's key): the kernel is the plain one.
    _extend_kernel[grid](
        q, k_buf, v_buf, out, req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_starts, blocks,
        sm_scale * k_scale, float(v_scale), q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1),
        v_buf.stride(0), v_buf.stride(1), out.stride(0), out.stride(1), req_to_token.stride(0),
        custom_mask, mask_starts if use_mask else None, mask_offsets if use_mask else None,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=block_m, BLOCK_N=64,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_CUSTOM_MASK=use_mask, num_warps=4,
        num_stages=2 if q.dtype == torch.float32 else 3,  # float32 tiles: three stages would not fit shared memory
    )
    return out
