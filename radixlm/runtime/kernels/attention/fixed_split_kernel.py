"""Batch-invariant attention's Triton kernel (fixed_split.py describes the rule): program (tile, kv head) takes up to
ROWS query rows of one request (a tile: fixed_split.span_tiles; a decode row is a tile of its own) with the GQA
group's query heads, ROWS x GROUP_P2 rows in one tl.dot tile (16 for Llama's groups of 4), and walks the request's
keys from position 0 in FIXED_SPLIT_SIZE blocks: one tl.dot of one tile shape per block for the scores and one for
the values, merged in an online softmax in position order. A row's result does not depend on the tile it shares:
each output row of a tl.dot is its own row's sum in the same order at any position of the tile, and a block past a
row's own keys leaves its state untouched (a select, not a no-op update that could flip a zero's sign). So a prompt's
row, a chunk's row, a row after a radix-cache hit, a decode row and a CUDA-graph replay's row all give the same
bits, while a prefill reads each block of keys once per tile of ROWS rows instead of once per row."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.fixed_split import FIXED_SPLIT_SIZE, row_tiles, rows_per_tile


# The row and tile vectors are views at any offset (a pass's positions, a graph's static rows).
@triton.jit(do_not_specialize_on_alignment=["Row_req", "Positions", "Tile_start", "Tile_rows"])
def _fixed_split_attention_kernel(Q, K_buf, V_buf, Req_to_token, Row_req, Positions, Tile_start, Tile_rows, Out, scale,
                                  v_scale, stride_qt, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ot,
                                  stride_oh, stride_r2t, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
                                  ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                                  BLOCK_N: tl.constexpr):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    first = tl.load(Tile_start + tile)
    count = tl.load(Tile_rows + tile)
    offs_h = tl.arange(0, ROWS * GROUP_P2)  # tile row i: query row i // GROUP_P2 of the tile, head i % GROUP_P2
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    head = offs_h % GROUP_P2
    slot = offs_h // GROUP_P2
    h_ok = head < GROUP
    d_ok = offs_d < HEAD_DIM
    row = first + tl.minimum(slot, count - 1)  # a tile's unused slots repeat its last row (not stored)
    req = tl.load(Row_req + first)
    n_row = tl.load(Positions + row) + 1
    n_max = tl.max(n_row, 0)
    heads = kvh * GROUP + head
    q = tl.load(Q + row[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([ROWS * GROUP_P2], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS * GROUP_P2], dtype=tl.float32)
    acc = tl.zeros([ROWS * GROUP_P2, BLOCK_D], dtype=tl.float32)
    for start in range(0, n_max, BLOCK_N):
        pos = start + offs_n
        valid = pos < n_max
        kv_slot = tl.load(Req_to_token + req * stride_r2t + pos, mask=valid, other=0).to(tl.int64)
        k = tl.load(K_buf + kv_slot[None, :] * stride_kb + kvh * stride_kh + offs_d[:, None],
                    mask=valid[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, k.to(q.dtype)) * scale
        s = tl.where(pos[None, :] < n_row[:, None], s, float("-inf"))
        active = start < n_row  # the block holds some of this row's keys (always its first block)
        m_new = tl.where(active, tl.maximum(m_i, tl.max(s, 1)), m_i)
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(V_buf + kv_slot[:, None] * stride_vb + kvh * stride_vh + offs_d[None, :],
                    mask=valid[:, None] & d_ok[None, :], other=0.0)
        l_i = tl.where(active, l_i * alpha + tl.sum(p, 1), l_i)
        acc = tl.where(active[:, None], acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype)), acc)
        m_i = m_new
    o = acc / l_i[:, None] * v_scale
    tl.store(Out + row[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], o.to(Out.dtype.element_ty),
             mask=(h_ok & (slot < count))[:, None] & d_ok[None, :])


def fixed_split_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                          row_req: torch.Tensor, positions: torch.Tensor, scale: float, v_scale: float = 1.0,
                          tiles: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """As fixed_split.fixed_split_attention_torch, on CUDA: q (T, H, D); returns (T, H, D). tiles: (first row, row
    count) int32 vectors, each tile's rows consecutive rows of one request, at most fixed_split.rows_per_tile(H // Hkv)
    of them (fixed_split.span_tiles); None: one tile per row. The lengths stay on the device (nothing here syncs), so
    a CUDA graph captures it."""
    t, h, d = q.shape
    hkv = k_buf.shape[1]
    if h % hkv:
        raise ValueError(f"{h} query heads do not group over {hkv} kv heads")
    out = torch.empty_like(q)
    if t == 0:
        return out
    group = h // hkv
    tile_start, tile_rows = tiles if tiles is not None else row_tiles(t, q.device)
    _fixed_split_attention_kernel[(tile_start.shape[0], hkv)](
        q, k_buf, v_buf, req_to_token, row_req, positions, tile_start, tile_rows, out, scale, v_scale, q.stride(0),
        q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), out.stride(0), out.stride(1),
        req_to_token.stride(0), GROUP=group, GROUP_P2=triton.next_power_of_2(group), ROWS=rows_per_tile(group),
        HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_N=FIXED_SPLIT_SIZE, num_warps=4, num_stages=2)
    return out
