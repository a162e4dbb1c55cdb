"""Decode attention over the paged KV pool: one new query token per request attends to its whole sequence.

Split-K in two stages. Stage 1: program (kv head, request, split) walks its share of the sequence in blocks of
BLOCK_N positions, gathers their K/V rows through req_to_token (so any page size works), and keeps an online
softmax for the GQA group of query heads that share the kv head (padded to BLOCK_H rows for tl.dot). It writes a
partial output and its log-sum-exp. Stage 2: program (request, head) merges the splits. With one split and no
shared prefixes stage 1 writes the output itself (DIRECT) and stage 2 does not run. Chunked passes (CHUNKED, small
batches: decode_splits.decode_chunk_capacity) replace the splits by a work list (decode_work.py, built on the device
once a pass): stage 1's program (kv head, entry) walks one equal part of one request, and stage 2 merges a request's
entries. The kv head is the grid's fastest axis: programs that run together read neighbouring kv heads of the same
pool rows (one row holds all of a slot's kv heads).

With shared prefixes (SharedPrefixes, shared_prefix.py) a grouped row's stage 1 covers [prefix_len,
seq_len) only (Row_starts), the prefix kernel writes its prefix partials into extra slots after the splits, and
stage 2 merges those too; slots nobody wrote keep a log-sum-exp of -inf and are not read."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.decode_splits import (
    DECODE_CHUNK_BLOCK_S, DECODE_CHUNK_MAX_ROWS, DecodeKernelConfig, KvPool, KvWiden, decode_chunk_capacity,
    decode_kernel_config, decode_num_splits, decode_wide_rows)
from radixlm.runtime.kernels.attention.decode_work import DecodeWork, decode_work_list
from radixlm.runtime.kernels.attention.shared_prefix import shared_prefix_stage1
from radixlm.runtime.kernels.attention.span import (
    attend_span, kv_convert_asm, kv_widen_factor, kv_widen_query_dtype)
from radixlm.runtime.kernels.pdl import pdl_options, pdl_wait


# Index vectors are often views at any offset (rows of one host-to-device copy, slices of the allocator's free list).
# Specialized on their 16-byte alignment, a kernel was compiled again in the middle of serving for misaligned ones.
INDEX_ARGS = ["Req_pool_indices", "Seq_lens", "Row_starts"]
# The split count varies with the batch and the longest sequence (eager passes) or the captured batch size (graphs):
# a runtime argument, not specialized (1 would become a constant, 16 a divisibility hint), nor are the partial
# log-sum-exps' strides that follow it (a chunked pass's list capacity enters as the split count). The partial
# outputs' strides (splits x head_dim, 0 for a chunked pass's one row) keep their hint: every head dim served is a
# multiple of 16. See radixlm/runtime/kernels/startup/kernel_variants.py.
SPLIT_ARGS = ["num_splits", "stride_mlb", "stride_mlh"]


@triton.jit(do_not_specialize=SPLIT_ARGS, do_not_specialize_on_alignment=INDEX_ARGS)
def _decode_stage1(
    Q, K_buf, V_buf, Req_to_token, Req_pool_indices, Seq_lens, Row_starts, Work, Mid_o, Mid_lse, O, sm_scale, v_scale,
    stride_qb, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_rt,
    stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh, num_splits,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, HAS_ROW_STARTS: tl.constexpr, DIRECT: tl.constexpr,
    CHUNKED: tl.constexpr, PREFETCH: tl.constexpr, KV_CVT: tl.constexpr, Q_F16: tl.constexpr,
    SWAPPED: tl.constexpr, Q_FP8: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_wait(PDL)  # every read is of the step's own data (the query, the pool, the work list)
    kvh = tl.program_id(0)
    if CHUNKED:  # num_splits: the list's capacity (decode_work.py); the partials are one row of entries
        split = tl.program_id(1)
        b = tl.load(Work + split)
        row = tl.load(Work + num_splits + split).to(tl.int64)
        start = tl.load(Work + 2 * num_splits + split)
        end = tl.load(Work + 3 * num_splits + split)
        if b < 0:
            return
    else:
        b = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(Seq_lens + b)
        if HAS_ROW_STARTS:
            first = tl.load(Row_starts + b)
        else:
            first = seq_len * 0
        per_split = tl.cdiv((seq_len - first).to(tl.int32), num_splits).to(seq_len.dtype)  # 32-bit (lengths < 2^31)
        start = first + split * per_split
        end = tl.minimum(start + per_split, seq_len)
        row = tl.load(Req_pool_indices + b)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)
    if Q_F16:  # a float8 pool widened to halves (decode_splits.KvWiden): the dots in float16
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)

    if SWAPPED:  # span._block_t's transposed products take a softmax scale per row
        sm_scale = tl.full([BLOCK_H], 1.0, tl.float32) * sm_scale
        if Q_FP8:  # each row in e4m3 at its own scale, which joins its softmax scale (fp8_query)
            qf = q.to(tl.float32)
            q_scale = tl.maximum(tl.max(tl.abs(qf), 1), 1e-30) / 448.0
            q = (qf / q_scale[:, None]).to(K_buf.dtype.element_ty)
            sm_scale = sm_scale * q_scale
    out, lse = attend_span(q, K_buf, V_buf, Req_to_token + row * stride_rt, start, end, kvh, sm_scale, v_scale,
                           stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, d_mask,
                           BLOCK_ROWS=BLOCK_H, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, PRECISION=PRECISION,
                           PREFETCH=PREFETCH, KV_CVT=KV_CVT, SWAPPED=SWAPPED)
    if DIRECT:
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=h_mask[:, None] & d_mask[None, :])
    else:
        tl.store(Mid_o + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos + offs_d[None, :], out,
                 mask=h_mask[:, None] & d_mask[None, :])
        tl.store(Mid_lse + b * stride_mlb + heads * stride_mlh + split, lse, mask=h_mask)


@triton.jit(do_not_specialize=SPLIT_ARGS)
def _decode_stage2(
    Mid_o, Mid_lse, O, Work, stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh,
    num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, CHUNKED: tl.constexpr,
    BLOCK_B: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    if CHUNKED:  # the request's entries: a window of the one row of partials
        first = tl.load(Work + 4 * num_splits + b)
        count = tl.load(Work + 4 * num_splits + BLOCK_B + b)
    else:
        first = 0
        count = num_splits
    # An online merge, BLOCK_S slots at a time (one tile where BLOCK_S covers every split). Slot `first` always holds
    # a partial of positions (a request's first split or entry is never empty), so m is finite after the first tile.
    m = float("-inf")
    den = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, count, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_mask = offs_s < count
        lse = tl.load(Mid_lse + b * stride_mlb + h * stride_mlh + first + offs_s, mask=s_mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, 0))
        kept = s_mask & (lse > float("-inf"))
        w = tl.where(kept, tl.exp(lse - m_new), 0.0)
        parts = tl.load(Mid_o + b * stride_mob + h * stride_moh + (first + offs_s)[:, None] * stride_mos
                        + offs_d[None, :], mask=kept[:, None] & d_mask[None, :], other=0.0)
        scale = tl.exp(m - m_new)
        acc = acc * scale + tl.sum(parts * w[:, None], 0)
        den = den * scale + tl.sum(w, 0)
        m = m_new
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, (acc / den).to(O.dtype.element_ty), mask=d_mask)


def fp8_query(q: torch.Tensor, k_buf: torch.Tensor, config: DecodeKernelConfig) -> bool:
    """Whether stage 1 runs Q K^T on FP8 with this launch: a swapped walk (span._block_t) over an e4m3 pool widened to
    halves (KvWiden.F16) for a bf16 / fp16 query, each (request, head) row of which the kernel rounds to e4m3 at its
    own scale, amax / 448, which then joins the softmax scale (the halves are then V's alone). Heads of 32 dimensions
    or more: Triton's FP8 dots take K >= 32, so narrower ones widen K too."""
    return (config.swapped and config.widen == KvWiden.F16 and k_buf.dtype == torch.float8_e4m3fn
            and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] >= 32)


def decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                     req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, max_seq_len: int,
                     num_splits: int | None = None, shared=None, work: DecodeWork | None = None,
                     chunked: bool = True, k_scale: float = 1.0, v_scale: float = 1.0,
                     config: DecodeKernelConfig | None = None) -> torch.Tensor:
    """q: (bs, H, D); k_buf, v_buf: (slots, Hkv, D), in q's dtype or float8 (read as stored times k_scale and
    v_scale: the pool's layer scales); returns (bs, H, D) in q's dtype. shared: the pass's
    SharedPrefixes (triton_backend.py), or None. A pass without shared prefixes of a batch size that
    decode_chunk_capacity chunks launches its work list (`work`, built here when not given) and ignores num_splits
    (a CUDA graph's split count too), unless not `chunked` (probes and tests of the split kernel). config: stage 1's
    launch (decode_kernel_config's default for the pool's dtype and the pass's width; benchmarks force others)."""
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    group = num_heads // num_kv_heads
    chunks = decode_chunk_capacity(bs, num_kv_heads) if chunked and shared is None else 0
    if chunks:
        if work is None:
            work = decode_work_list(seq_lens, req_pool_indices, bs, chunks)
        assert work.capacity == chunks, (work.capacity, chunks)  # the backend sized it by the same kv heads
        num_splits = chunks
    elif num_splits is None:
        num_splits = decode_num_splits(max_seq_len, bs, num_kv_heads)
    out = torch.empty_like(q)
    direct = num_splits == 1 and shared is None
    slots = num_splits + (shared.num_splits if shared is not None else 0)
    if direct:  # no partials: the output stands in for their pointers (DIRECT never reads them)
        mid_o, mid_lse = out, out
        mid_strides = (0, 0, 0, 0, 0)
    else:
        rows = 1 if chunks else bs  # chunked: one row of entries, which every request indexes at 0
        mid_o = torch.empty(rows, num_heads, slots, head_dim, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(rows, num_heads, slots, dtype=torch.float32, device=q.device)
        mid_strides = (0 if chunks else mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
                       0 if chunks else mid_lse.stride(0), mid_lse.stride(1))
    block_d = triton.next_power_of_2(head_dim)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # float32 stays exact (no TF32 rounding)
    if shared is not None:
        mid_lse[:, :, num_splits:].fill_(float("-inf"))  # ungrouped rows' prefix slots
        shared_prefix_stage1(q, k_buf, v_buf, req_to_token, req_pool_indices, shared, mid_o, mid_lse, sm_scale,
                             num_splits, precision, k_scale, v_scale)
    table = work.table if chunks else None
    if config is None:
        wide = shared is None and bs >= decode_wide_rows(num_kv_heads)
        config = decode_kernel_config(KvPool.of(k_buf.dtype), wide)
    # The query rows stacked a program: the products' M side (16, mma.sync's least), or transposed their N side (8).
    block_h = max(8 if config.swapped else 16, triton.next_power_of_2(group))
    kv_cvt = kv_convert_asm(k_buf.dtype, q.dtype, q.device, config.widen) if config.inline_cvt else ""
    q_fp8 = fp8_query(q, k_buf, config)
    q_f16 = not q_fp8 and kv_widen_query_dtype(k_buf.dtype, q.dtype, config.widen) != q.dtype
    k_scale, v_scale = (s * kv_widen_factor(k_buf.dtype, q.dtype, config.widen) for s in (k_scale, v_scale))
    pdl = pdl_options(q.device, bs)
    _decode_stage1[(num_kv_heads, chunks) if chunks else (num_kv_heads, bs, num_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, shared.row_starts if shared is not None else None,
        table, mid_o, mid_lse, out, sm_scale * k_scale, float(v_scale),
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        req_to_token.stride(0), *mid_strides, out.stride(0), out.stride(1),
        num_splits, GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_H=block_h,
        BLOCK_N=config.block_n, num_warps=config.num_warps, num_stages=config.num_stages, PRECISION=precision,
        HAS_ROW_STARTS=shared is not None, DIRECT=direct, CHUNKED=bool(chunks), PREFETCH=config.prefetch,
        KV_CVT=kv_cvt, Q_F16=q_f16, SWAPPED=config.swapped, Q_FP8=q_fp8,
        **({"maxnreg": config.maxnreg} if config.maxnreg and q.is_cuda else {}), **pdl,
    )
    if direct:
        return out
    _decode_stage2[(bs, num_heads)](
        mid_o, mid_lse, out, table, *mid_strides, out.stride(0), out.stride(1), slots, HEAD_DIM=head_dim,
        BLOCK_D=block_d, BLOCK_S=DECODE_CHUNK_BLOCK_S if chunks else triton.next_power_of_2(slots), num_warps=4,
        CHUNKED=bool(chunks), BLOCK_B=DECODE_CHUNK_MAX_ROWS, **pdl,
    )
    return out
