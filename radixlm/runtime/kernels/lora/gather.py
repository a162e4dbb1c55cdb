"""The batched LoRA kernels of eager passes, over blocks of at most BLOCK_M rows of one slot read through an index
(lora/blocks.py). Grid: (block, ...); unused blocks (length 0) and base rows' (slot -1) return at once, and nothing is
read back on the host. CUDA-graph decode ran them over blocks of 16 rows before kernels/lora/decode.py (the decode
sweep, benchmarks/kernels/lora_decode_sweep.py, times that form as the old path).

The shrink writes x @ A^T in float32 per K split, (splits, positions, W) in sorted-row order: decode's blocks are
few and K long (4096-14336), so each block's K loop is cut over SPLITS programs (one program streaming all of K
per block was the fixed cost of LoRA decode: latency-bound, a few programs for the whole GPU); an eager pass splits
K only when its blocks are few (a short prefill). The expand sums the splits in a fixed order (unrolled for graph
decode, a loop for eager passes; no atomics) and adds scaling * (x @ A^T) @ B^T to each row of the output in place.
B is block diagonal over a fused layer's parts (q|k|v, gate|up): a column tile of part j reads only part j's rank
block of B and of x @ A^T, not the zeros."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.lora.shapes import GATHER_BLOCK_ROWS, check_lora_args, check_parts

MAX_SPLITS = 16  # the most K splits of a block's shrink (each at least MIN_SPLIT_K columns)
MIN_SPLIT_K = 256
EAGER_PROGRAMS = 256  # shrink programs an eager pass aims for (two per SM on an H100/H200) before splitting K
BLOCK_N = 128


def _config(block_rows: int) -> tuple[int, int]:
    """(shrink BLOCK_K, expand num_warps) of a block size: decode's 16 rows, eager passes' 64. The expand runs one
    stage: its W loop is one iteration up to rank 64, and pipelining it only multiplied the split partials' shared
    memory (147 KiB a program at rank 64, bf16)."""
    return (128, 4) if block_rows <= GATHER_BLOCK_ROWS else (64, 8)


def split_k(k: int, block_rows: int, programs: int = 1) -> int:
    """The K columns of one shrink program. Graph decode (blocks of GATHER_BLOCK_ROWS; its grid is fixed, so this
    may depend on K only): up to MAX_SPLITS ways. Eager passes, whose `programs` (blocks x W blocks) are known: as
    many ways as bring them to EAGER_PROGRAMS (a prefill of thousands of rows takes K whole; a short one splits)."""
    block_k = _config(block_rows)[0]
    ways = MAX_SPLITS if block_rows <= GATHER_BLOCK_ROWS else min(MAX_SPLITS, triton.cdiv(EAGER_PROGRAMS, programs))
    return max(MIN_SPLIT_K, triton.cdiv(triton.cdiv(k, ways), block_k) * block_k)


@triton.jit(do_not_specialize=["K_SPLIT", "stride_ps"])
def _shrink(x_ptr, a_ptr, part_ptr, rows_ptr, blk_start_ptr, blk_len_ptr, blk_slot_ptr, K, W, K_SPLIT, stride_xm,
            stride_as, stride_aw, stride_ps, stride_pm, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr):
    blk, wblk, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(blk_slot_ptr + blk)
    n = tl.load(blk_len_ptr + blk)
    if slot >= 0 and n > 0:
        start = tl.load(blk_start_ptr + blk)
        rm = tl.arange(0, BLOCK_M)
        rows = tl.load(rows_ptr + start + rm, mask=rm < n, other=0).to(tl.int64)
        rw = wblk * BLOCK_W + tl.arange(0, BLOCK_W)
        rk = tl.arange(0, BLOCK_K)
        k_lo = split * K_SPLIT
        k_hi = tl.minimum(K, k_lo + K_SPLIT)
        acc = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            x = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + rk)[None, :],
                        mask=(rm[:, None] < n) & (k0 + rk[None, :] < k_hi), other=0.0)
            a = tl.load(a_ptr + slot.to(tl.int64) * stride_as + rw[None, :] * stride_aw + (k0 + rk)[:, None],
                        mask=(rw[None, :] < W) & (k0 + rk[:, None] < k_hi), other=0.0)
            acc += tl.dot(x, a, input_precision=PRECISION)
        tl.store(part_ptr + split * stride_ps + (start + rm)[:, None] * stride_pm + rw[None, :], acc,
                 mask=(rm[:, None] < n) & (rw[None, :] < W))


@triton.jit
def _expand_part(acc, part_ptr, b_ptr, slot, start, rm, n, rn, n_lo, n_hi, lo, hi, w_lo, R, num_splits, stride_ps,
                 stride_pm, stride_bs, stride_bn, PRECISION: tl.constexpr, SPLITS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr):
    """acc + the columns [lo, hi) of the tile (one part's) from that part's rank block [w_lo, w_lo + R). The split
    partials: SPLITS of them, unrolled (graph decode: fixed per K); SPLITS 0, num_splits in a loop (eager)."""
    if (n_hi > lo) & (n_lo < hi):
        cols = (rn >= lo) & (rn < hi)
        rw = tl.arange(0, BLOCK_W)
        for w0 in range(0, R, BLOCK_W):
            w = w0 + rw
            xa = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
            ptrs = part_ptr + (start + rm)[:, None] * stride_pm + (w_lo + w)[None, :]
            mask = (rm[:, None] < n) & (w[None, :] < R)
            if SPLITS > 0:
                for s in tl.static_range(SPLITS):
                    xa += tl.load(ptrs + s * stride_ps, mask=mask, other=0.0)
            else:
                for s in range(num_splits):
                    xa += tl.load(ptrs + s * stride_ps, mask=mask, other=0.0)
            b = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + rn[None, :] * stride_bn + (w_lo + w)[:, None],
                        mask=cols[None, :] & (w[:, None] < R), other=0.0)
            acc += tl.dot(xa, b.to(tl.float32), input_precision=PRECISION)
    return acc


@triton.jit(do_not_specialize=["num_splits", "stride_ps"])
def _expand(part_ptr, b_ptr, out_ptr, scaling_ptr, rows_ptr, blk_start_ptr, blk_len_ptr, blk_slot_ptr, N, R, P1, P2,
            num_splits, stride_ps, stride_pm, stride_bs, stride_bn, stride_om, PRECISION: tl.constexpr,
            NUM_PARTS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_W: tl.constexpr):
    blk, nblk = tl.program_id(0), tl.program_id(1)
    slot = tl.load(blk_slot_ptr + blk)
    n = tl.load(blk_len_ptr + blk)
    if slot >= 0 and n > 0:
        start = tl.load(blk_start_ptr + blk)
        rm = tl.arange(0, BLOCK_M)
        rows = tl.load(rows_ptr + start + rm, mask=rm < n, other=0).to(tl.int64)
        n_lo = nblk * BLOCK_N
        n_hi = n_lo + BLOCK_N
        rn = n_lo + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # Part j: output columns [P_j, P_j+1) (P0 = 0, P_NUM_PARTS = N), rank block [j * R, (j + 1) * R).
        acc = _expand_part(acc, part_ptr, b_ptr, slot, start, rm, n, rn, n_lo, n_hi, 0, P1, 0, R, num_splits,
                           stride_ps, stride_pm, stride_bs, stride_bn, PRECISION, SPLITS, BLOCK_M, BLOCK_W)
        if NUM_PARTS > 1:
            acc = _expand_part(acc, part_ptr, b_ptr, slot, start, rm, n, rn, n_lo, n_hi, P1, P2, R, R, num_splits,
                               stride_ps, stride_pm, stride_bs, stride_bn, PRECISION, SPLITS, BLOCK_M, BLOCK_W)
        if NUM_PARTS > 2:
            acc = _expand_part(acc, part_ptr, b_ptr, slot, start, rm, n, rn, n_lo, n_hi, P2, N, 2 * R, R, num_splits,
                               stride_ps, stride_pm, stride_bs, stride_bn, PRECISION, SPLITS, BLOCK_M, BLOCK_W)
        acc = acc * tl.load(scaling_ptr + slot)
        mask = (rm[:, None] < n) & (rn[None, :] < N)
        ptrs = out_ptr + rows[:, None] * stride_om + rn[None, :]
        base = tl.load(ptrs, mask=mask, other=0.0)
        tl.store(ptrs, (base.to(tl.float32) + acc).to(out_ptr.dtype.element_ty), mask=mask)


def gather_lora_add(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, sorted_rows: torch.Tensor,
                    block_starts: torch.Tensor, block_lens: torch.Tensor, block_slots: torch.Tensor,
                    scalings: torch.Tensor, block_rows: int = GATHER_BLOCK_ROWS,
                    parts: tuple[int, ...] | None = None) -> torch.Tensor:
    """out (rows, N) += for each row r of a block, scaling[slot] * x[r] @ A[slot]^T @ B[slot]^T; a (slots, W, K),
    b (slots, N, W) block diagonal over `parts` (the fused parts' output sizes; None: one part); blocks of at most
    block_rows rows (lora/blocks.py's table)."""
    rows, k, w, n = check_lora_args(out, x, a, b, min_rows=int(sorted_rows.shape[0]))
    parts = check_parts(parts, n, w)
    num_blocks = int(block_slots.shape[0])
    if num_blocks == 0 or rows == 0:
        return out
    if block_rows < 1 or block_rows & (block_rows - 1):
        raise ValueError(f"block_rows must be a power of 2, got {block_rows}")
    # float32 models: IEEE products. 16-bit: the shrink's products in their own dtype (exact, float32 sums), the
    # expand's float32 xa in tf32 (its rounding is below the 16-bit output's).
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    block_k, warps = _config(block_rows)
    shrink_w = min(64, max(16, triton.next_power_of_2(w)))
    static = block_rows <= GATHER_BLOCK_ROWS  # graph decode: SPLITS a constant of K (unrolled in the expand)
    chunk = split_k(k, block_rows, num_blocks * triton.cdiv(w, shrink_w))
    splits = triton.cdiv(k, chunk)
    partials = torch.empty(splits, int(sorted_rows.shape[0]), w, dtype=torch.float32, device=x.device)
    _shrink[(num_blocks, triton.cdiv(w, shrink_w), splits)](
        x, a, partials, sorted_rows, block_starts, block_lens, block_slots, k, w, chunk, x.stride(0), a.stride(0),
        a.stride(1), partials.stride(0), partials.stride(1), PRECISION=precision, BLOCK_M=block_rows,
        BLOCK_W=shrink_w, BLOCK_K=block_k, num_warps=4)
    r = w // len(parts)
    ends = [sum(parts[: j + 1]) for j in range(len(parts))] + [n, n]
    _expand[(num_blocks, triton.cdiv(n, BLOCK_N))](
        partials, b, out, scalings, sorted_rows, block_starts, block_lens, block_slots, n, r, ends[0], ends[1], splits,
        partials.stride(0), partials.stride(1), b.stride(0), b.stride(1), out.stride(0), PRECISION=precision,
        NUM_PARTS=len(parts), SPLITS=splits if static else 0, BLOCK_M=block_rows, BLOCK_N=BLOCK_N,
        BLOCK_W=max(16, triton.next_power_of_2(min(r, 64))), num_warps=warps, num_stages=1)
    return out
