"""Rows of many buffers into rows of as many others in one launch (Triton), on the source's GPU: for each buffer b
and token i, dst[b][dst_slots[i]] = src[b][src_slots[i]]. The destination buffers may live on another GPU this one
reaches over NVLink (a disaggregated decode server's KV pool, opened through CUDA IPC): the source GPU's threads store
into that memory, so the destination GPU runs nothing of this process's (a kernel of another process's context there
would take turns with its own passes) and nothing is allocated there. One launch for every layer's K and V, instead
of a gather, a copy and a scatter per buffer."""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

BLOCK_T = 16  # tokens per program
BLOCK_W = 256  # words per row chunk


@triton.jit(do_not_specialize=["num_tokens", "row_words"])
def _copy_rows_kernel(Src_ptrs, Dst_ptrs, Src_slots, Dst_slots, num_tokens, row_words, WORD_BYTES: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    buf = tl.program_id(0)
    if WORD_BYTES == 8:
        word = tl.int64
    elif WORD_BYTES == 4:
        word = tl.int32
    elif WORD_BYTES == 2:
        word = tl.int16
    else:
        word = tl.int8
    src = tl.load(Src_ptrs + buf).to(tl.pointer_type(word))
    dst = tl.load(Dst_ptrs + buf).to(tl.pointer_type(word))
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < num_tokens
    s = tl.load(Src_slots + t, mask=tm, other=0).to(tl.int64) * row_words
    d = tl.load(Dst_slots + t, mask=tm, other=0).to(tl.int64) * row_words
    for w0 in range(0, row_words, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        m = tm[:, None] & (w[None, :] < row_words)
        x = tl.load(src + s[:, None] + w[None, :], mask=m)
        tl.store(dst + d[:, None] + w[None, :], x, mask=m)


def _word_bytes(row_bytes: int) -> int:
    return next(w for w in (8, 4, 2, 1) if row_bytes % w == 0)


def copy_rows(src: list[torch.Tensor], src_slots: torch.Tensor, dst: list[torch.Tensor],
              dst_slots: torch.Tensor) -> None:
    """Enqueued on the current stream of src's device. src and dst: contiguous buffers indexed by their first
    dimension, pairwise of equal row shape and dtype, src all on one device; the slots: 1-D, anywhere."""
    if len(src) != len(dst) or not src:
        raise ValueError(f"copy_rows: {len(src)} source buffers for {len(dst)} destinations")
    n = src_slots.numel()
    if dst_slots.numel() != n:
        raise ValueError(f"copy_rows: {n} source slots for {dst_slots.numel()} destination slots")
    groups: dict[int, list[int]] = {}  # row bytes -> the buffers with rows of that size (one launch each)
    for i, (a, b) in enumerate(zip(src, dst)):
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype or not (a.is_contiguous() and b.is_contiguous()):
            raise ValueError(f"copy_rows: buffer {i} rows {tuple(a.shape[1:])} {a.dtype} into "
                             f"{tuple(b.shape[1:])} {b.dtype} (both contiguous, alike)")
        if a.device != src[0].device:
            raise ValueError("copy_rows: the source buffers are on different devices")
        groups.setdefault(a[0].numel() * a.element_size(), []).append(i)
    if n == 0:
        return
    device = src[0].device
    src_slots = src_slots.to(device=device, dtype=torch.int64)
    dst_slots = dst_slots.to(device=device, dtype=torch.int64)
    for row_bytes, idx in groups.items():
        word = _word_bytes(row_bytes)
        src_ptrs = torch.tensor([src[i].data_ptr() for i in idx], dtype=torch.int64).to(device, non_blocking=True)
        dst_ptrs = torch.tensor([dst[i].data_ptr() for i in idx], dtype=torch.int64).to(device, non_blocking=True)
        grid = (len(idx), triton.cdiv(n, BLOCK_T))
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            _copy_rows_kernel[grid](src_ptrs, dst_ptrs, src_slots, dst_slots, n, row_bytes // word, WORD_BYTES=word,
                                    BLOCK_T=BLOCK_T, BLOCK_W=BLOCK_W)
