"""The tensor-parallel all-reduce, the residual add and the RMSNorm of a decoder layer in one launch (Triton), over
buffers every rank of one host reaches (symmetric memory over NVLink): each program takes one row, stores this rank's
partial sum of it into this rank's buffer, signals the program of the same row on every peer, waits for theirs, reads
the peers' rows and sums them in rank order (so every rank computes the same bits), then adds the residual and
normalises as fused_kernels._rmsnorm_kernel does.

Layout of each rank's buffer (`ArNormLayout`): a counter per (row, source rank) at the start, then two slots of rows.
A signal adds one to the receiver's counter and its waiter takes one off, so no signal is lost when a fast rank
signals the next call's before its peer has consumed this one's. A program alternates slots from call to call by a
counter of its own (`epochs`, one per row, on this rank's GPU): every rank runs the same calls with the same rows, so
the counters agree without any traffic. Writing slot e % 2 at call e is safe: this program's wait at call e - 1 saw the
peer's signal of call e - 1, which the peer sent after its call e - 2, the last reader of that slot, had finished."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Counters are laid out for this many rows; more take the unfused path. On 2 x H200 a 1,024-row call gave sums
# unlike the unfused all-reduce's (tests/runtime/distributed/test_symm_all_reduce.py at 5050bf4), while 1 to 256
# rows, eager and in CUDA-graph replays, matched. Its PTX then showed a race that would do it: thread 0 stored the
# next epoch before the barrier, so a warp that read it late took the other slot. The store now follows the barrier;
# until a GPU run says 1,024 rows match, 256.
MAX_ROWS = 256


@dataclass(frozen=True)
class ArNormLayout:
    """Where a rank's buffer holds what: set once by the communicator for its buffer size and world size."""

    world_size: int
    buffer_bytes: int

    @property
    def flag_bytes(self) -> int:
        return MAX_ROWS * self.world_size * 4

    @property
    def data_offset(self) -> int:
        return -(-self.flag_bytes // 256) * 256

    @property
    def slot_bytes(self) -> int:
        return (self.buffer_bytes - self.data_offset) // 2 // 256 * 256

    def max_rows(self, row_bytes: int) -> int:
        """0 where rows are not whole 16-byte vectors (the kernel moves them as such)."""
        return 0 if row_bytes % 16 else min(MAX_ROWS, self.slot_bytes // row_bytes)


@triton.jit
def _arnorm_kernel(Bufs, Epochs, X, R, W, Out, ResOut, stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
                   rank, data_offset, slot_elems, RANKS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    dt = X.dtype.element_ty
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    epoch = tl.load(Epochs + row)
    at = data_offset + (epoch % 2) * slot_elems + row * n_cols  # in elements of dt, from a buffer's base
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    mine = tl.load(Bufs + rank)
    # The buffers' bases are 256-byte aligned and `at` a multiple of 8 elements: 16-byte vectors in and out of them.
    tl.store(tl.multiple_of(mine.to(tl.pointer_type(dt)) + at, 16) + offs, x, mask=mask)
    # Every thread's store before the signal, and every thread's read of the epoch before it moves on.
    tl.debug_barrier()
    tl.store(Epochs + row, epoch + 1)
    flags = mine.to(tl.pointer_type(tl.int32)) + row * RANKS
    for p in tl.static_range(RANKS):
        if p != rank:
            theirs = tl.load(Bufs + p).to(tl.pointer_type(tl.int32)) + row * RANKS + rank
            tl.atomic_add(theirs, 1, sem="release", scope="sys")
    for p in tl.static_range(RANKS):
        if p != rank:
            seen = tl.atomic_add(flags + p, 0, sem="acquire", scope="sys")
            while seen == 0:
                seen = tl.atomic_add(flags + p, 0, sem="acquire", scope="sys")
            tl.atomic_add(flags + p, -1, sem="relaxed", scope="sys")
    tl.debug_barrier()  # every thread's loads after the waits
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(RANKS):
        if p == rank:
            part = x
        else:
            peer = tl.multiple_of(tl.load(Bufs + p).to(tl.pointer_type(dt)) + at, 16)
            part = tl.load(peer + offs, mask=mask, other=0.0, cache_modifier=".cv")
        acc += part.to(tl.float32)
    s = acc.to(dt)  # the all-reduce's result, rounded as an unfused all-reduce rounds it
    h = (s.to(tl.float32) + tl.load(R + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)).to(dt)
    tl.store(ResOut + row * stride_ro + offs, h, mask=mask)
    hf = h.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    normed = (hf * inv).to(dt).to(tl.float32)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + offs, (w * normed).to(Out.dtype.element_ty), mask=mask)


def inline_builds() -> tuple:
    """The kernels a discovery run (startup/kernel_builds.ParallelBuilds) must build inline: this collective one. A
    launch skipped there on one rank, while a rank whose build had finished launched it, left that rank waiting for
    its peer forever (a float32 TP=2 start on 2 x H200: the communicator's bf16 probe had not built that variant)."""
    return (_arnorm_kernel,)


def allreduce_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                          bufs: torch.Tensor, epochs: torch.Tensor, rank: int, layout: ArNormLayout
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * norm(s + residual), s + residual), s the sum over ranks of x (T, H). bufs: every rank's buffer
    address (int64, rank order, on x's device); epochs: this rank's per-row call counters (int32, MAX_ROWS). Every
    rank must make the same calls with the same shapes: a call waits for its peers' matching call."""
    n, h = x.shape
    if n > layout.max_rows(h * x.element_size()) or not x.is_contiguous():
        raise ValueError(f"allreduce_add_rmsnorm: {n} rows of {h} do not fit the buffer (or x is not contiguous)")
    out = torch.empty(n, h, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x)
    if n:
        size = x.element_size()
        _arnorm_kernel[(n,)](bufs, epochs, x, residual, weight, out, res_out, x.stride(0), residual.stride(0),
                             out.stride(0), res_out.stride(0), h, eps, rank, layout.data_offset // size,
                             layout.slot_bytes // size, RANKS=layout.world_size, BLOCK=triton.next_power_of_2(h),
                             num_warps=4 if h <= 2048 else 8)
    return out, res_out
