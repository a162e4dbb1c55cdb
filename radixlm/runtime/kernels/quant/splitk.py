"""The split-K partials' reduction of the quantized GEMMs (tiles.split_k): the float32 partials summed in split order,
plus the bias, rounded once to the output dtype (Triton), in one launch after the GEMM (reduce_splits); and the
arrival counters with which a kernel sums them itself (the last of a tile's programs to arrive: last_to_arrive,
split_counters; int4_packed's few-row kernel).

In the launch pays only for the few rows of decode: at 64 rows the tensor-core kernels' 64 x 64 and 64 x 128 tiles
summed by one program each (4 warps, the splits one after another) made Llama-8B's split GEMMs slower than with
reduce_splits' launch across the GPU (H200: FP8 o_proj 21.0 against 14.0 us, down_proj 36.7 against 30.4; W4A16
down_proj 64.1 against 35.7; at 8-16 rows from 1% faster to 10% slower;
benchmarks/results/kernels/h200/splitk_in_launch/)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.pdl import pdl_options, pdl_wait
from radixlm.runtime.kernels.quant import tiles

COUNTER_SLOTS = 4096  # output tiles a launch summing its own split may have


@triton.jit
def tile_range(M, N, K, k_tiles_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The program's output tile (grid: N tiles, M tiles, K splits) and its K tiles [t0, t1): offs_m, offs_n, offs_k,
    m_mask, n_mask, t0, t1, pid_k."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    t0 = pid_k * k_tiles_per_split
    t1 = tl.minimum(t0 + k_tiles_per_split, tl.cdiv(K, BLOCK_K))
    return offs_m, offs_n, tl.arange(0, BLOCK_K), offs_m < M, offs_n < N, t0, t1, pid_k


@triton.jit
def store_tile(acc, Y, Bias, offs_m, offs_n, m_mask, n_mask, stride_ym, stride_ys, pid_k, SPLIT: tl.constexpr,
               HAS_BIAS: tl.constexpr):
    """A GEMM tile's float32 result: with SPLIT, program pid_k's partial into its slice of Y (float32, summed by
    reduce_splits); else plus the bias, rounded once to Y's dtype."""
    y_ptrs = Y + offs_m[:, None] * stride_ym + offs_n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT:
        tl.store(y_ptrs + pid_k * stride_ys, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "splits", "stride_ps"])
def _reduce_splits_kernel(P, B, Y, M, N, splits, stride_ps, stride_pm, stride_ym, HAS_BIAS: tl.constexpr,
                          BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, splits):
        acc += tl.load(P + s * stride_ps + row * stride_pm + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_ym + offs, acc.to(Y.dtype.element_ty), mask=mask)


REDUCE_BLOCK = 1024


def reduce_splits(partials: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """out (M, N) = sum over the splits of partials (S, M, N) float32, + bias, rounded once to out's dtype."""
    s, m, n = partials.shape
    _reduce_splits_kernel[(m, triton.cdiv(n, REDUCE_BLOCK))](
        partials, bias if bias is not None else partials, out, m, n, s, partials.stride(0), partials.stride(1),
        out.stride(0), HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK, num_warps=4, **pdl_options(out.device, m))
    return out


@triton.jit
def last_to_arrive(Cnt, slot, splits):
    """After this program's partial is stored (by all its threads): whether it is the last of the slot's `splits`
    programs (the counter, released after the stores, acquired before the caller's loads of the others' partials)."""
    tl.debug_barrier()
    return tl.atomic_add(Cnt + slot, 1, sem="acq_rel", scope="gpu") == splits - 1


@triton.jit
def reset_counter(Cnt, slot):
    """The last program's: the slot back to zero for the next launch on the stream."""
    tl.atomic_xchg(Cnt + slot, 0, sem="relaxed", scope="gpu")


@dataclass
class SplitCounters:
    """One device's arrival counters of the in-kernel reduction, one int32 an output tile, zero between launches (each
    launch's last programs zero theirs). Launches on one stream run one after another, so they share the slots; split
    GEMMs on two streams at once must not both use them (radixlm runs its GEMMs on the forward pass's stream)."""

    device: torch.device
    counters: torch.Tensor | None = None

    def take(self, slots: int, capturing: bool) -> torch.Tensor | None:
        """The counters, or None (the caller launches reduce_splits): more output tiles than COUNTER_SLOTS, or inside
        a CUDA-graph capture before any eager launch allocated them (a capture allocates nothing here)."""
        if self.counters is None:
            if capturing:
                return None
            self.counters = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=self.device)
        return self.counters if slots <= COUNTER_SLOTS else None


split_counters = tiles.per_device(SplitCounters)  # one counter buffer per device


def counters_for(x: torch.Tensor, slots: int, splits: int, fused: bool) -> torch.Tensor | None:
    """The counters of a launch whose `slots` output tiles are each split `splits` ways, where the reduction runs in
    the kernel (fused), else None."""
    if not fused or splits <= 1:
        return None
    return split_counters(x.device).take(slots, x.is_cuda and torch.cuda.is_current_stream_capturing())
