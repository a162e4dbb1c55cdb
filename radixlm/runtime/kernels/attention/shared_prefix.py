"""Shared-prefix (cascade) decode attention: the decode rows of a prefix group read the group's prefix KV once.

A group is a set of batch rows whose req_to_token rows hold the same slots over [0, prefix_len) (SharedPrefixes in
layers/attention/triton_backend.py states the invariant). Its rows are cut into tiles of rows_per_tile requests;
program (tile, kv head, split) stacks the tile's query heads of that kv head, request by request, into a BLOCK_M x
head_dim operand, walks its share of the prefix in blocks of BLOCK_N positions (K/V gathered through the first
row's table, as the decode kernel does) with an online softmax, and writes a partial output and log-sum-exp per
(row, head) into the decode kernel's partial buffers at slot slot0 + split. The decode kernel's stage 1 covers
[prefix_len, seq_len) of grouped rows and its stage 2 merges every slot: the result is plain decode attention."""
from __future__ import annotations

import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.decode_splits import DECODE_BLOCK_N, shared_prefix_block_m
from radixlm.runtime.kernels.attention.span import attend_span, kv_convert_asm

# Views of one host-to-device copy at any offset (see decode_attention.INDEX_ARGS).
INDEX_ARGS = ["Req_pool_indices", "Tile_rows", "Tiles"]
# Vary per pass: the tile count, the prefix split count, the decode kernel's split count (the first prefix slot) and
# the log-sum-exp strides that follow the slot count (see kernels/startup/kernel_variants.py).
STEP_ARGS = ["num_tiles", "num_splits", "slot0", "stride_mlb", "stride_mlh"]


@triton.jit(do_not_specialize=STEP_ARGS, do_not_specialize_on_alignment=INDEX_ARGS)
def _shared_prefix_stage1(
    Q, K_buf, V_buf, Req_to_token, Req_pool_indices, Tile_rows, Tiles, Mid_o, Mid_lse, sm_scale, v_scale,
    stride_qb, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_rt,
    stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, num_tiles, num_splits, slot0,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, KV_CVT: tl.constexpr,
):
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    first = tl.load(Tiles + t)
    n_rows = tl.load(Tiles + num_tiles + t)
    prefix_len = tl.load(Tiles + 2 * num_tiles + t)
    table_row = tl.load(Req_pool_indices + tl.load(Tile_rows + first))
    per_split = tl.cdiv(prefix_len.to(tl.int32), num_splits).to(prefix_len.dtype)
    start = split * per_split
    end = tl.minimum(start + per_split, prefix_len)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m // GROUP < n_rows
    d_mask = offs_d < HEAD_DIM
    b = tl.load(Tile_rows + first + offs_m // GROUP, mask=m_mask, other=0)
    heads = kvh * GROUP + offs_m % GROUP
    q = tl.load(Q + b[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)

    out, lse = attend_span(q, K_buf, V_buf, Req_to_token + table_row * stride_rt, start, end, kvh, sm_scale,
                           v_scale, stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, d_mask,
                           BLOCK_ROWS=BLOCK_M, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, PRECISION=PRECISION,
                           PREFETCH=0, KV_CVT=KV_CVT, SWAPPED=False)
    slot = slot0 + split
    tl.store(Mid_o + b[:, None] * stride_mob + heads[:, None] * stride_moh + slot * stride_mos + offs_d[None, :], out,
             mask=m_mask[:, None] & d_mask[None, :])
    tl.store(Mid_lse + b * stride_mlb + heads * stride_mlh + slot, lse, mask=m_mask)


def shared_prefix_stage1(q, k_buf, v_buf, req_to_token, req_pool_indices, shared, mid_o, mid_lse, sm_scale: float,
                         slot0: int, precision: str, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Partials of every grouped row against its group's prefix, into slots [slot0, slot0 + shared.num_splits); a
    float8 pool's K and V read times k_scale and v_scale."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buf.shape[1]
    group = num_heads // num_kv_heads
    _shared_prefix_stage1[(shared.num_tiles, num_kv_heads, shared.num_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, shared.tile_rows, shared.tiles, mid_o, mid_lse,
        sm_scale * k_scale, float(v_scale), q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1),
        v_buf.stride(0), v_buf.stride(1), req_to_token.stride(0), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1), shared.num_tiles, shared.num_splits, slot0,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=shared_prefix_block_m(group),
        BLOCK_N=DECODE_BLOCK_N, PRECISION=precision, KV_CVT=kv_convert_asm(k_buf.dtype, q.dtype, q.device),
        num_warps=4, num_stages=2,
    )
