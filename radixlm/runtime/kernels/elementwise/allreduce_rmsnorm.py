"""The tensor-parallel all-reduce, the residual add and the RMSNorm of a decoder layer in one launch (Triton), over
buffers every rank of one host reaches (symmetric memory over NVLink): each program takes one row, stores this rank's
partial sum of it into every peer's buffer, waits until the peers' partials have landed in its own, sums them in rank
order (so every rank computes the same bits), then adds the residual and normalises as fused_kernels._rmsnorm_kernel
does.

No flags: the data is its own signal (as in Lamport's single-writer buffers). Every byte of the slots starts as 0xFF,
an element of all one bits (a NaN in bf16, fp16 and float32) means "not arrived", and a sender stores its partial
with that one pattern changed to another NaN (`_sendable`). A receiver re-reads its slot until no element is the
pattern, and after its sum writes the pattern back. So a call costs one one-way trip over NVLink instead of a
signal's round trip and then a remote read's.

Each rank's buffer (`ArNormLayout`) holds two slots, a slot one row per (row, sender). A program alternates slots
from call to call by a counter of its own (`epochs`, one per row, on this rank's GPU): every rank runs the same calls
with the same rows, so the counters agree without any traffic. Sending into a peer's slot e % 2 at call e is safe: the
peer read and reset that slot at call e - 2, and finished it before its call e - 1 sent what this program waited
for at call e - 1."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.elementwise.fused_kernels import norm_values, rmsnorm_warps

# The per-row epochs are laid out for this many rows; more take the unfused path. On 2 x H200 a 1,024-row call of the
# flag protocol this kernel replaced gave sums unlike the unfused all-reduce's (a race on its epoch store, fixed
# since); until a GPU run says 1,024 rows match, 256.
MAX_ROWS = 256
EMPTY_BYTE = 0xFF  # every byte of a slot not yet written (or read and reset): all one bits in any element width


@dataclass(frozen=True)
class ArNormLayout:
    """Where a rank's buffer holds what: set once by the communicator for its buffer size and world size."""

    world_size: int
    buffer_bytes: int

    @property
    def slot_bytes(self) -> int:
        return self.buffer_bytes // 2 // 256 * 256

    def max_rows(self, row_bytes: int) -> int:
        """0 where rows are not whole 16-byte vectors (the kernel moves them as such)."""
        return 0 if row_bytes % 16 else min(MAX_ROWS, self.slot_bytes // (row_bytes * self.world_size))


@triton.jit
def _sendable(x, BITS: tl.constexpr):
    """x's bits as integers, the all-ones pattern (a NaN, alone of all values) turned into another NaN."""
    if BITS == 16:
        b = x.to(tl.int16, bitcast=True)
        b = tl.where(b == -1, b & 0x7FFF, b)
    else:
        b = x.to(tl.int32, bitcast=True)
        b = tl.where(b == -1, b & 0x7FFFFFFF, b)
    return b


@triton.jit
def _arnorm_kernel(Bufs, Epochs, X, R, W, Out, ResOut, stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
                   rank, slot_elems, RANKS: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    dt = X.dtype.element_ty
    it = tl.int16 if BITS == 16 else tl.int32
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    epoch = tl.load(Epochs + row)
    slot = (epoch % 2) * slot_elems + row * RANKS * n_cols  # this row's senders, in elements from a buffer's base
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    bits = _sendable(x, BITS)
    # The buffers' bases are 256-byte aligned and rows whole 16-byte vectors (a row of 16-bit elements a multiple of
    # 8): 16-byte vectors in and out of them.
    for q in tl.static_range(1, RANKS):
        theirs = tl.multiple_of(tl.load(Bufs + (rank + q) % RANKS).to(tl.pointer_type(it)), 256)
        tl.store(theirs + tl.multiple_of(slot + rank * n_cols, 8) + offs, bits, mask=mask)
    tl.debug_barrier()  # every thread's read of the epoch before it moves on
    tl.store(Epochs + row, epoch + 1)
    mine = tl.multiple_of(tl.load(Bufs + rank).to(tl.pointer_type(it)), 256)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(RANKS):  # in rank order; this rank's own part from x, with no branch on the rank
        peer = mask & (tl.full([BLOCK], p, tl.int32) != rank)
        src = mine + tl.multiple_of(slot + p * n_cols, 8) + offs
        got = tl.load(src, mask=peer, other=0, volatile=True)
        while tl.sum(((got == -1) & peer).to(tl.int32), axis=0) > 0:
            got = tl.load(src, mask=peer, other=0, volatile=True)
        tl.store(src, tl.full([BLOCK], -1, it), mask=peer)  # empty again for this slot's next call
        acc += tl.where(peer, got.to(dt, bitcast=True), x).to(tl.float32)
    s = acc.to(dt)  # the all-reduce's result, rounded as an unfused all-reduce rounds it
    h = (s.to(tl.float32) + tl.load(R + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)).to(dt)
    tl.store(ResOut + row * stride_ro + offs, h, mask=mask)
    tl.store(Out + row * stride_o + offs, norm_values(h, W, offs, mask, n_cols, eps).to(Out.dtype.element_ty),
             mask=mask)


def inline_builds() -> tuple:
    """The kernels a discovery run (startup/kernel_builds.ParallelBuilds) must build inline: this collective one. A
    launch skipped there on one rank, while a rank whose build had finished launched it, left that rank waiting for
    its peer forever (a float32 TP=2 start on 2 x H200: the communicator's bf16 probe had not built that variant)."""
    return (_arnorm_kernel,)


def allreduce_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                          bufs: torch.Tensor, epochs: torch.Tensor, rank: int, layout: ArNormLayout
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * norm(s + residual), s + residual), s the sum over ranks of x (T, H). bufs: every rank's buffer
    address (int64, rank order, on x's device), each slot filled with EMPTY_BYTE before the first call; epochs: this
    rank's per-row call counters (int32, MAX_ROWS). Every rank must make the same calls with the same shapes: a call
    waits for its peers' matching call."""
    n, h = x.shape
    if n > layout.max_rows(h * x.element_size()) or not x.is_contiguous():
        raise ValueError(f"allreduce_add_rmsnorm: {n} rows of {h} do not fit the buffer (or x is not contiguous)")
    out = torch.empty(n, h, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x)
    if n:
        size = x.element_size()
        _arnorm_kernel[(n,)](bufs, epochs, x, residual, weight, out, res_out, x.stride(0), residual.stride(0),
                             out.stride(0), res_out.stride(0), h, eps, rank, layout.slot_bytes // size,
                             RANKS=layout.world_size, BITS=8 * size, BLOCK=triton.next_power_of_2(h),
                             num_warps=rmsnorm_warps(h))  # the norm's sum in rmsnorm's order
    return out, res_out
