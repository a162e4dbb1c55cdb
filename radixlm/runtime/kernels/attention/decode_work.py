"""The work list of a chunked decode pass (decode_splits.decode_chunk_capacity), built on the device from Seq_lens by
one small launch before the pass's layers, so that a CUDA graph replays it for whatever lengths its rows have. Every
layer's decode kernels read it (decode.py, CHUNKED).

Layout (int32): entries [0, capacity): the entry's request (-1 past the list), then its request's pool row, then its
first position, then its end (four vectors of `capacity`: stage 1 loads them at once); then per request
(DECODE_CHUNK_MAX_ROWS each) its first entry and its entry count.
Entries go request after request, each request's parts equal in whole blocks of the decode kernel's BLOCK_N
positions (decode_splits.decode_chunk_layout, the host mirror)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.attention.decode_splits import (
    DECODE_BLOCK_N, DECODE_CHUNK_MAX_ROWS, DECODE_CHUNK_SPARE)

# Entries the builder's one program lays out: every capacity decode_chunk_capacity gives.
WORK_BLOCK_E = triton.next_power_of_2(DECODE_CHUNK_MAX_ROWS + DECODE_CHUNK_SPARE)


@dataclass
class DecodeWork:
    """Set by decode_work_list (the attention backend's metadata, once a pass); read by decode_attention."""

    capacity: int  # entries per kv head: the stage-1 grid
    table: torch.Tensor  # the layout above, on the device


@triton.jit(do_not_specialize=["num_rows", "capacity"], do_not_specialize_on_alignment=["Seq_lens", "Req_pool_indices"])
def _decode_work(Seq_lens, Req_pool_indices, Work, num_rows, capacity, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    offs = tl.arange(0, BLOCK_B)
    lens = tl.load(Seq_lens + offs, mask=offs < num_rows, other=0).to(tl.int32)
    rows = tl.load(Req_pool_indices + offs, mask=offs < num_rows, other=0).to(tl.int32)
    blocks = tl.cdiv(lens, BLOCK_N)
    chunk = tl.maximum(tl.cdiv(tl.sum(blocks, 0), capacity - num_rows), 1)
    counts = tl.cdiv(blocks, chunk)
    ends = tl.cumsum(counts, 0)
    firsts = ends - counts
    parts = tl.cdiv(blocks, tl.maximum(counts, 1)) * BLOCK_N  # positions
    tl.store(Work + 4 * capacity + offs, firsts)
    tl.store(Work + 4 * capacity + BLOCK_B + offs, counts)
    e = tl.arange(0, BLOCK_E)
    # Rows past num_rows take no entries: their end is the list's, so an entry past it counts every row (BLOCK_B).
    req = tl.sum((ends[None, :] <= e[:, None]).to(tl.int32), 1)
    mine = offs[None, :] == req[:, None]
    part = tl.sum(tl.where(mine, parts[None, :], 0), 1)
    start = (e - tl.sum(tl.where(mine, firsts[None, :], 0), 1)) * part
    end = tl.minimum(start + part, tl.sum(tl.where(mine, lens[None, :], 0), 1))
    in_list = e < capacity
    tl.store(Work + e, tl.where(req < num_rows, req, -1), mask=in_list)
    tl.store(Work + capacity + e, tl.sum(tl.where(mine, rows[None, :], 0), 1), mask=in_list)
    tl.store(Work + 2 * capacity + e, start, mask=in_list)
    tl.store(Work + 3 * capacity + e, end, mask=in_list)


def decode_work_list(seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, num_rows: int,
                     capacity: int) -> DecodeWork:
    """The work list of a chunked pass of num_rows rows (its lengths and request rows on the device; capacity from
    decode_chunk_capacity)."""
    assert 2 <= num_rows <= DECODE_CHUNK_MAX_ROWS and num_rows < capacity <= WORK_BLOCK_E, (num_rows, capacity)
    table = torch.empty(4 * capacity + 2 * DECODE_CHUNK_MAX_ROWS, dtype=torch.int32, device=seq_lens.device)
    _decode_work[(1,)](seq_lens, req_pool_indices, table, num_rows, capacity, BLOCK_B=DECODE_CHUNK_MAX_ROWS,
                       BLOCK_E=WORK_BLOCK_E, BLOCK_N=DECODE_BLOCK_N, num_warps=4)
    return DecodeWork(capacity, table)


def inline_builds() -> tuple:
    """The kernels a discovery run (kernel_builds.ParallelBuilds) must build inline: the work list's builder (its
    table indexes the decode kernels' reads)."""
    return (_decode_work,)
