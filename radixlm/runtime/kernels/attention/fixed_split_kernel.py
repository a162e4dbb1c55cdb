"""Batch-invariant attention's Triton kernel (fixed_split.py describes the rule). A program takes one tile of query
rows of one request (fixed_split.span_tiles; a decode row is a tile of its own) and one kv head, in SUB sub-tiles of
ROWS consecutive rows each: a sub-tile is ROWS rows x the GQA group's query heads (padded to GROUP_P2), one 16-row
tl.dot tile for Llama's groups of 4. The program walks the request's keys from position 0 in FIXED_SPLIT_SIZE blocks,
loading each block's keys and values once, and runs every sub-tile's step on them in turn (_sub_tile_scores: one
tl.dot of one shape for the scores and the online softmax's update, in position order; then _sub_tile_values: one
tl.dot of one shape for the values).

A row's result does not depend on the program it runs in: each output row of a tl.dot is its own row's sum in the
same order at any position of its sub-tile; every sub-tile runs the same step on tiles of the same shape, layout and
warps (SUB changes how many run, never what one computes: a larger dot would change the MMA instruction Triton
picks, mma.sync to wgmma, and so the sums); and a block past a row's own keys leaves its state untouched (a select,
not a no-op update that could flip a zero's sign). So a prompt's row, a chunk's row, a row after a radix-cache hit, a
decode row and a CUDA-graph replay's row all give the same bits, while a prefill reads each block of keys once per
ROWS x SUB rows instead of once per row."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.fixed_split import (
    FIXED_SPLIT_SIZE, MAX_SUB_TILES, row_tiles, rows_per_tile)
from radixlm.runtime.kernels.attention.fixed_split_config import ALLOWED_STAGES

# The launch of every pass. num_warps sets the tl.dot and reduction layouts and so a row's sums: one value for every
# pass (a decode row and a prefill row must sum alike). Stages only schedule the loads (built for sm_90, every allowed
# stage count gives the same floating-point instructions; a test builds them): the default 3 double-buffers the keys
# and values, so a block's loads overlap the previous block's math (2 gave one buffer, waited for at the top of each
# block), at the smem of 3 programs an SM. A GPU's table (fixed_split_config) may pick other stages per launch.
NUM_WARPS = 4
NUM_STAGES = 3


@triton.jit
def _sub_tile_scores(q, m_i, l_i, n_row, k, pos, start, scale):
    """One key block's scores for one sub-tile's rows (n_row: each row's key count): the row's new maximum, its
    rescale factor and sum, and its probabilities."""
    s = tl.dot(q, k) * scale
    s = tl.where(pos[None, :] < n_row[:, None], s, float("-inf"))
    active = start < n_row  # the block holds some of this row's keys (always its first block)
    m_new = tl.where(active, tl.maximum(m_i, tl.max(s, 1)), m_i)
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = tl.where(active, l_i * alpha + tl.sum(p, 1), l_i)
    return m_new, l_i, alpha, p.to(q.dtype), active


@triton.jit
def _sub_tile_values(acc, alpha, p, active, v):
    """The sub-tile's values for the block (p: _sub_tile_scores's probabilities, alpha its rescale)."""
    return tl.where(active[:, None], acc * alpha[:, None] + tl.dot(p, v), acc)


# The row and tile vectors are views at any offset (a pass's positions, a graph's static rows).
@triton.jit(do_not_specialize_on_alignment=["Row_req", "Positions", "Tile_start", "Tile_rows"])
def _fixed_split_attention_kernel(Q, K_buf, V_buf, Req_to_token, Row_req, Positions, Tile_start, Tile_rows, Out, scale,
                                  v_scale, num_kv_heads, stride_qt, stride_qh, stride_kb, stride_kh, stride_vb,
                                  stride_vh, stride_ot, stride_oh, stride_r2t, GROUP: tl.constexpr,
                                  GROUP_P2: tl.constexpr, ROWS: tl.constexpr, SUB: tl.constexpr,
                                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    # A tile's kv heads are neighbouring programs (they read the same key slots); the tiles come longest first.
    pid = tl.program_id(0)
    tile = pid // num_kv_heads
    kvh = pid % num_kv_heads
    first = tl.load(Tile_start + tile)
    count = tl.load(Tile_rows + tile)
    offs_h = tl.arange(0, ROWS * GROUP_P2)  # sub-tile row i: query row i // GROUP_P2 of it, head i % GROUP_P2
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    head = offs_h % GROUP_P2
    slot = offs_h // GROUP_P2
    h_ok = head < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = kvh * GROUP + head
    req = tl.load(Row_req + first)
    qs = ()
    n_rows = ()
    ms = ()
    ls = ()
    accs = ()
    n_max = 0
    for j in tl.static_range(SUB):
        row = first + tl.minimum(j * ROWS + slot, count - 1)  # a tile's unused slots repeat its last row (not stored)
        n_row = tl.load(Positions + row) + 1
        n_max = tl.maximum(n_max, tl.max(n_row, 0))
        qs = qs + (tl.load(Q + row[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                           mask=h_ok[:, None] & d_ok[None, :], other=0.0),)
        n_rows = n_rows + (n_row,)
        ms = ms + (tl.full([ROWS * GROUP_P2], float("-inf"), dtype=tl.float32),)
        ls = ls + (tl.zeros([ROWS * GROUP_P2], dtype=tl.float32),)
        accs = accs + (tl.zeros([ROWS * GROUP_P2, BLOCK_D], dtype=tl.float32),)
    # Each block's key slots are read one block ahead, so that its keys' and values' addresses do not wait on them.
    slots = Req_to_token + req * stride_r2t
    kv_next = tl.load(slots + offs_n, mask=offs_n < n_max, other=0)
    for start in range(0, n_max, BLOCK_N):
        pos = start + offs_n
        valid = pos < n_max
        kv_slot = kv_next.to(tl.int64)
        kv_next = tl.load(slots + BLOCK_N + pos, mask=BLOCK_N + pos < n_max, other=0)
        k = tl.load(K_buf + kv_slot[None, :] * stride_kb + kvh * stride_kh + offs_d[:, None],
                    mask=valid[None, :] & d_ok[:, None], other=0.0).to(Q.dtype.element_ty)
        v = tl.load(V_buf + kv_slot[:, None] * stride_vb + kvh * stride_vh + offs_d[None, :],
                    mask=valid[:, None] & d_ok[None, :], other=0.0).to(Q.dtype.element_ty)
        # Every sub-tile's scores, then every sub-tile's values: the keys' and values' operands are not live at once
        # (fewer registers; the order of independent sub-tiles changes no row's arithmetic).
        new_ms = ()
        new_ls = ()
        alphas = ()
        ps = ()
        actives = ()
        for j in tl.static_range(SUB):
            m_j, l_j, alpha_j, p_j, active_j = _sub_tile_scores(qs[j], ms[j], ls[j], n_rows[j], k, pos, start, scale)
            new_ms = new_ms + (m_j,)
            new_ls = new_ls + (l_j,)
            alphas = alphas + (alpha_j,)
            ps = ps + (p_j,)
            actives = actives + (active_j,)
        new_accs = ()
        for j in tl.static_range(SUB):
            new_accs = new_accs + (_sub_tile_values(accs[j], alphas[j], ps[j], actives[j], v),)
        ms = new_ms
        ls = new_ls
        accs = new_accs
    for j in tl.static_range(SUB):
        row = first + tl.minimum(j * ROWS + slot, count - 1)
        o = accs[j] / ls[j][:, None] * v_scale
        tl.store(Out + row[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(Out.dtype.element_ty), mask=(h_ok & (j * ROWS + slot < count))[:, None] & d_ok[None, :])


def fixed_split_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                          row_req: torch.Tensor, positions: torch.Tensor, scale: float, v_scale: float = 1.0,
                          tiles: tuple[torch.Tensor, torch.Tensor] | None = None, sub_tiles: int = 1,
                          out: torch.Tensor | None = None, num_stages: int = NUM_STAGES) -> torch.Tensor:
    """As fixed_split.fixed_split_attention_torch, on CUDA: q (T, H, D); returns (T, H, D). tiles: (first row, row
    count) int32 vectors, each tile's rows consecutive rows of one request, at most rows_per_tile(H // Hkv) x
    sub_tiles of them (fixed_split.span_tiles), in any order; None: one tile per row. out: the output to write the
    tiles' rows into (a pass in several launches, fixed_split.span_launches), else a new one. The lengths stay on
    the device (nothing here syncs), so a CUDA graph captures it."""
    t, h, d = q.shape
    hkv = k_buf.shape[1]
    if h % hkv:
        raise ValueError(f"{h} query heads do not group over {hkv} kv heads")
    if not 1 <= sub_tiles <= MAX_SUB_TILES:
        raise ValueError(f"sub_tiles {sub_tiles} outside 1..{MAX_SUB_TILES}")
    if num_stages not in ALLOWED_STAGES:
        raise ValueError(f"num_stages {num_stages} not one of {ALLOWED_STAGES}")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} for q {tuple(q.shape)} {q.dtype}")
    if t == 0:
        return out
    group = h // hkv
    tile_start, tile_rows = tiles if tiles is not None else row_tiles(t, q.device)
    _fixed_split_attention_kernel[(tile_start.shape[0] * hkv,)](
        q, k_buf, v_buf, req_to_token, row_req, positions, tile_start, tile_rows, out, scale, v_scale, hkv,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), out.stride(0),
        out.stride(1), req_to_token.stride(0), GROUP=group, GROUP_P2=triton.next_power_of_2(group),
        ROWS=rows_per_tile(group), SUB=sub_tiles, HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d),
        BLOCK_N=FIXED_SPLIT_SIZE, num_warps=NUM_WARPS, num_stages=num_stages)
    return out
