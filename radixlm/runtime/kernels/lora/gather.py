"""The gather kernels of batched LoRA (CUDA-graph decode): the segment kernels' shrink and expand over blocks of at
most BLOCK_M rows of one slot, each row read through an index (lora/graph.py groups a pass's rows by slot). The grid
is fixed by the graph's row count (blocks, column blocks): unused blocks (length 0) and base rows' (slot -1) return
at once, and nothing is read back on the host, so one captured graph serves any mix of adapters.

The shrink writes x @ A^T (in sorted-row order, float32); the expand adds scaling * (x @ A^T) @ B^T to each row of
the output in place. Each adapter's A and B are read once per block (not per row)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.lora.shapes import GATHER_BLOCK_ROWS, check_lora_args

BLOCK_M = GATHER_BLOCK_ROWS
SHRINK_BLOCK_W = 16  # A's rows per program: W / 16 programs share a block's shrink (rank 16 qkv: 3)
SHRINK_BLOCK_K = 128
EXPAND_BLOCK_N = 128  # fewer programs: most of a graph's blocks are unused and return at once


@triton.jit
def _gather_shrink(x_ptr, a_ptr, xa_ptr, rows_ptr, blk_start_ptr, blk_len_ptr, blk_slot_ptr, K, W, stride_xm,
                   stride_as, stride_aw, stride_xam, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr):
    blk, wblk = tl.program_id(0), tl.program_id(1)
    slot = tl.load(blk_slot_ptr + blk)
    n = tl.load(blk_len_ptr + blk)
    if slot >= 0 and n > 0:
        start = tl.load(blk_start_ptr + blk)
        rm = tl.arange(0, BLOCK_M)
        rows = tl.load(rows_ptr + start + rm, mask=rm < n, other=0).to(tl.int64)
        rw = wblk * BLOCK_W + tl.arange(0, BLOCK_W)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + rk)[None, :],
                        mask=(rm[:, None] < n) & (k0 + rk[None, :] < K), other=0.0)
            a = tl.load(a_ptr + slot.to(tl.int64) * stride_as + rw[None, :] * stride_aw + (k0 + rk)[:, None],
                        mask=(rw[None, :] < W) & (k0 + rk[:, None] < K), other=0.0)
            acc += tl.dot(x, a, input_precision=PRECISION)
        tl.store(xa_ptr + (start + rm)[:, None] * stride_xam + rw[None, :], acc,
                 mask=(rm[:, None] < n) & (rw[None, :] < W))


@triton.jit
def _gather_expand(xa_ptr, b_ptr, out_ptr, scaling_ptr, rows_ptr, blk_start_ptr, blk_len_ptr, blk_slot_ptr, N, W,
                   stride_xam, stride_bs, stride_bn, stride_om, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    blk, nblk = tl.program_id(0), tl.program_id(1)
    slot = tl.load(blk_slot_ptr + blk)
    n = tl.load(blk_len_ptr + blk)
    if slot >= 0 and n > 0:
        start = tl.load(blk_start_ptr + blk)
        rm = tl.arange(0, BLOCK_M)
        rows = tl.load(rows_ptr + start + rm, mask=rm < n, other=0).to(tl.int64)
        rn = nblk * BLOCK_N + tl.arange(0, BLOCK_N)
        rw = tl.arange(0, BLOCK_W)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for w0 in range(0, W, BLOCK_W):
            xa = tl.load(xa_ptr + (start + rm)[:, None] * stride_xam + (w0 + rw)[None, :],
                         mask=(rm[:, None] < n) & (w0 + rw[None, :] < W), other=0.0)
            b = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + rn[None, :] * stride_bn + (w0 + rw)[:, None],
                        mask=(rn[None, :] < N) & (w0 + rw[:, None] < W), other=0.0)
            acc += tl.dot(xa, b.to(tl.float32), input_precision=PRECISION)
        acc = acc * tl.load(scaling_ptr + slot)
        mask = (rm[:, None] < n) & (rn[None, :] < N)
        ptrs = out_ptr + rows[:, None] * stride_om + rn[None, :]
        base = tl.load(ptrs, mask=mask, other=0.0)
        tl.store(ptrs, (base.to(tl.float32) + acc).to(out_ptr.dtype.element_ty), mask=mask)


def gather_lora_add(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, sorted_rows: torch.Tensor,
                    block_starts: torch.Tensor, block_lens: torch.Tensor, block_slots: torch.Tensor,
                    scalings: torch.Tensor) -> torch.Tensor:
    """out (rows, N) += for each row r of a block, scaling[slot] * x[r] @ A[slot]^T @ B[slot]^T; a (slots, W, K),
    b (slots, N, W); blocks of at most BLOCK_M rows (lora/graph.py's table)."""
    rows, k, w, n = check_lora_args(out, x, a, b, min_rows=int(sorted_rows.shape[0]))
    num_blocks = int(block_slots.shape[0])
    if num_blocks == 0 or rows == 0:
        return out
    # float32 models: IEEE products. 16-bit: the shrink's products in their own dtype (exact, float32 sums), the
    # expand's float32 xa in tf32 (its rounding is below the 16-bit output's).
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    xa = torch.empty(rows, w, dtype=torch.float32, device=x.device)
    _gather_shrink[(num_blocks, triton.cdiv(w, SHRINK_BLOCK_W))](
        x, a, xa, sorted_rows, block_starts, block_lens, block_slots, k, w, x.stride(0), a.stride(0), a.stride(1),
        xa.stride(0), PRECISION=precision, BLOCK_M=BLOCK_M, BLOCK_W=SHRINK_BLOCK_W, BLOCK_K=SHRINK_BLOCK_K)
    block_w = max(16, triton.next_power_of_2(min(w, 64)))
    _gather_expand[(num_blocks, triton.cdiv(n, EXPAND_BLOCK_N))](
        xa, b, out, scalings, sorted_rows, block_starts, block_lens, block_slots, n, w, xa.stride(0), b.stride(0),
        b.stride(1), out.stride(0), PRECISION=precision, BLOCK_M=BLOCK_M, BLOCK_N=EXPAND_BLOCK_N, BLOCK_W=block_w)
    return out
