"""Batched LoRA for CUDA-graph decode (few rows per adapter), laid out for bytes and few programs.

The pass's adapter rows come as padded blocks (lora/blocks.py's PaddedLayout): block b holds one slot's rows (at
most BLOCK_M, -1 padded) at block_rows[b], its slot at block_slots[b] (-1: unused). Every program reads its block's
slot and rows in one step (no start/length indirection), and the shrink's float32 partials live at the block's own
positions (blk * BLOCK_M + i), so the expand reads them without waiting for the table.

- shrink, grid (blocks, W tiles, splits): x[rows] @ A[slot]^T over one K split, pipelined over BLOCK_K columns.
- expand, grid (blocks, N chunks): sums the splits once per program (a fixed order, unrolled), then streams a chunk
  of `tiles_per_program` output tiles of B[slot] (only each fused part's rank block: B is block diagonal), adding
  scaling * xa @ B^T to the rows in place. One program per (block, N chunk) instead of one per (block, 128-column
  tile): the table, the rows and the split sum are paid once per chunk, and B streams through a pipelined loop.

Per row the sum is fixed by (K, config) alone: splits in order, then one dot per part; base rows are never touched.
The launch parameters are LoraDecodeConfig (a tuned table per GPU model: tuned/lora_decode_<GPU>.json, written by
benchmarks/kernels/lora_decode_sweep.py --install; else the defaults)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.lora.config import LoraDecodeConfig
from radixlm.runtime.kernels.lora.shapes import check_lora_args, check_parts


@triton.jit
def _block_rows(blk_slot_ptr, blk_rows_ptr, blk, BLOCK_M: tl.constexpr):
    """A row block's adapter slot (-1: no adapter), its row offsets, which are real rows, and their int64 indices."""
    slot = tl.load(blk_slot_ptr + blk)
    rm = tl.arange(0, BLOCK_M)
    rows = tl.load(blk_rows_ptr + blk * BLOCK_M + rm)
    valid = rows >= 0
    return slot, rm, valid, tl.where(valid, rows, 0).to(tl.int64)


@triton.jit(do_not_specialize=["K_SPLIT"])
def _shrink_padded(x_ptr, a_ptr, part_ptr, blk_slot_ptr, blk_rows_ptr, K, W, K_SPLIT, stride_xm, stride_as,
                   stride_aw, stride_ps, stride_pm, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    blk, wblk, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot, rm, valid, rows64 = _block_rows(blk_slot_ptr, blk_rows_ptr, blk, BLOCK_M)
    if slot >= 0:
        rw = wblk * BLOCK_W + tl.arange(0, BLOCK_W)
        rk = tl.arange(0, BLOCK_K)
        k_lo = split * K_SPLIT
        k_hi = tl.minimum(K, k_lo + K_SPLIT)
        a_base = a_ptr + slot.to(tl.int64) * stride_as + rw[None, :] * stride_aw
        acc = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            k = k0 + rk
            x = tl.load(x_ptr + rows64[:, None] * stride_xm + k[None, :], mask=valid[:, None] & (k[None, :] < k_hi),
                        other=0.0)
            a = tl.load(a_base + k[:, None], mask=(rw[None, :] < W) & (k[:, None] < k_hi), other=0.0)
            acc += tl.dot(x, a, input_precision=PRECISION)
        tl.store(part_ptr + split * stride_ps + (blk * BLOCK_M + rm)[:, None] * stride_pm + rw[None, :], acc,
                 mask=valid[:, None] & (rw[None, :] < W))


@triton.jit
def _xa(part_ptr, blk, rm, valid, rw, w_lo, R, stride_ps, stride_pm, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_R: tl.constexpr):
    """x @ A^T of one part's rank block [w_lo, w_lo + R): the SPLITS partials summed in split order."""
    ptrs = part_ptr + (blk * BLOCK_M + rm)[:, None] * stride_pm + (w_lo + rw)[None, :]
    mask = valid[:, None] & (rw[None, :] < R)
    xa = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        xa += tl.load(ptrs + s * stride_ps, mask=mask, other=0.0)
    return xa


@triton.jit(do_not_specialize=["TILES"])
def _expand_padded(part_ptr, b_ptr, out_ptr, scaling_ptr, blk_slot_ptr, blk_rows_ptr, N, R, P1, P2, TILES,
                   stride_ps, stride_pm, stride_bs, stride_bn, stride_om, PRECISION: tl.constexpr,
                   NUM_PARTS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_R: tl.constexpr, NUM_STAGES: tl.constexpr):
    blk, chunk = tl.program_id(0), tl.program_id(1)
    slot, rm, valid, rows64 = _block_rows(blk_slot_ptr, blk_rows_ptr, blk, BLOCK_M)
    if slot >= 0:
        rw = tl.arange(0, BLOCK_R)
        # Part j: output columns [P_j, P_j+1) (P0 = 0, P_NUM_PARTS = N), rank block [j * R, (j + 1) * R).
        xa0 = _xa(part_ptr, blk, rm, valid, rw, 0, R, stride_ps, stride_pm, SPLITS, BLOCK_M, BLOCK_R)
        xa1 = xa0
        xa2 = xa0
        if NUM_PARTS > 1:
            xa1 = _xa(part_ptr, blk, rm, valid, rw, R, R, stride_ps, stride_pm, SPLITS, BLOCK_M, BLOCK_R)
        if NUM_PARTS > 2:
            xa2 = _xa(part_ptr, blk, rm, valid, rw, 2 * R, R, stride_ps, stride_pm, SPLITS, BLOCK_M, BLOCK_R)
        scale = tl.load(scaling_ptr + slot)
        b_base = b_ptr + slot.to(tl.int64) * stride_bs
        out_rows = out_ptr + rows64[:, None] * stride_om
        t_lo = chunk * TILES
        t_hi = tl.minimum(t_lo + TILES, tl.cdiv(N, BLOCK_N))
        for t in tl.range(t_lo, t_hi, num_stages=NUM_STAGES):
            rn = t * BLOCK_N + tl.arange(0, BLOCK_N)
            # Masked loads, no branches: a column outside part j reads nothing of its rank block (zeros).
            b = tl.load(b_base + rn[None, :] * stride_bn + rw[:, None],
                        mask=(rn[None, :] < P1) & (rw[:, None] < R), other=0.0)
            acc = tl.dot(xa0, b.to(tl.float32), input_precision=PRECISION)
            if NUM_PARTS > 1:
                b = tl.load(b_base + rn[None, :] * stride_bn + (R + rw)[:, None],
                            mask=(rn[None, :] >= P1) & (rn[None, :] < P2) & (rw[:, None] < R), other=0.0)
                acc += tl.dot(xa1, b.to(tl.float32), input_precision=PRECISION)
            if NUM_PARTS > 2:
                b = tl.load(b_base + rn[None, :] * stride_bn + (2 * R + rw)[:, None],
                            mask=(rn[None, :] >= P2) & (rn[None, :] < N) & (rw[:, None] < R), other=0.0)
                acc += tl.dot(xa2, b.to(tl.float32), input_precision=PRECISION)
            mask = valid[:, None] & (rn[None, :] < N)
            ptrs = out_rows + rn[None, :]
            base = tl.load(ptrs, mask=mask, other=0.0)
            tl.store(ptrs, (base.to(tl.float32) + acc * scale).to(out_ptr.dtype.element_ty), mask=mask)


def decode_shrink(x: torch.Tensor, a: torch.Tensor, block_slots: torch.Tensor, block_rows: torch.Tensor,
                  config: LoraDecodeConfig, partials: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 split partials of x @ A[slot]^T, (splits, blocks * block_m, W), for decode_expand. partials: the
    buffer to write (decode_partials' shape), e.g. allocated on the stream that reads it."""
    rows, k = x.shape
    slots, w, k_a = a.shape
    num_blocks = int(block_slots.shape[0])
    if k_a != k or x.stride(1) != 1 or a.stride(2) != 1:
        raise ValueError(f"LoRA shrink shapes do not fit: x {tuple(x.shape)}, A {tuple(a.shape)}")
    if block_rows.shape != (num_blocks * config.block_m,):
        raise ValueError(f"block_rows {tuple(block_rows.shape)} is not {num_blocks} blocks of {config.block_m}")
    shape = decode_partials(k, w, num_blocks, config)
    if partials is None:
        partials = torch.empty(shape, dtype=torch.float32, device=x.device)
    elif tuple(partials.shape) != shape or partials.dtype != torch.float32 or not partials.is_contiguous():
        raise ValueError(f"partials {tuple(partials.shape)} {partials.dtype} are not float32 {shape}")
    if num_blocks == 0 or rows == 0:
        return partials
    block_w = min(config.shrink_block_w, max(16, triton.next_power_of_2(w)))
    _shrink_padded[(num_blocks, triton.cdiv(w, block_w), shape[0])](
        x, a, partials, block_slots, block_rows, k, w, config.split_k(k), x.stride(0), a.stride(0), a.stride(1),
        partials.stride(0), partials.stride(1), PRECISION=_precision(x.dtype), BLOCK_M=config.block_m,
        BLOCK_W=block_w, BLOCK_K=config.shrink_block_k, NUM_STAGES=config.shrink_stages,
        num_warps=config.shrink_warps)
    return partials


def decode_partials(k: int, w: int, num_blocks: int, config: LoraDecodeConfig) -> tuple[int, int, int]:
    """The shape of decode_shrink's partials."""
    return triton.cdiv(k, config.split_k(k)), num_blocks * config.block_m, w


def decode_expand(out: torch.Tensor, partials: torch.Tensor, b: torch.Tensor, block_slots: torch.Tensor,
                  block_rows: torch.Tensor, scalings: torch.Tensor, parts: tuple[int, ...] | None,
                  config: LoraDecodeConfig, precision_dtype: torch.dtype) -> torch.Tensor:
    """out += scaling[slot] * (sum of the partials) @ B[slot]^T for each block's rows. precision_dtype: the
    activations' dtype (float32: IEEE products)."""
    splits, positions, w = partials.shape
    slots, n, w_b = b.shape
    num_blocks = int(block_slots.shape[0])
    if w_b != w or out.shape[1] != n or positions != num_blocks * config.block_m or b.stride(2) != 1 \
            or out.stride(1) != 1 or not partials.is_contiguous():
        raise ValueError(f"LoRA expand shapes do not fit: partials {tuple(partials.shape)}, B {tuple(b.shape)}, "
                         f"out {tuple(out.shape)}, {num_blocks} blocks of {config.block_m}")
    parts = check_parts(parts, n, w)
    if num_blocks == 0 or out.shape[0] == 0:
        return out
    r = w // len(parts)
    if r > 64:
        raise ValueError(f"the decode kernels take ranks up to 64, got {r}")
    tiles = config.tiles_per_program(n, num_blocks)
    ends = [sum(parts[: j + 1]) for j in range(len(parts))] + [n, n]
    _expand_padded[(num_blocks, triton.cdiv(triton.cdiv(n, config.expand_block_n), tiles))](
        partials, b, out, scalings, block_slots, block_rows, n, r, ends[0], ends[1], tiles, partials.stride(0),
        partials.stride(1), b.stride(0), b.stride(1), out.stride(0), PRECISION=_precision(precision_dtype),
        NUM_PARTS=len(parts), SPLITS=splits, BLOCK_M=config.block_m, BLOCK_N=config.expand_block_n,
        BLOCK_R=max(16, triton.next_power_of_2(r)), NUM_STAGES=config.expand_stages, num_warps=config.expand_warps)
    return out


def _precision(dtype: torch.dtype) -> str:
    """float32 models: IEEE products. 16-bit: the shrink's products in their own dtype (exact, float32 sums), the
    expand's float32 xa in tf32 (its rounding is below the 16-bit output's)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_lora_add(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, block_slots: torch.Tensor,
                    block_rows: torch.Tensor, scalings: torch.Tensor, parts: tuple[int, ...] | None = None,
                    config: LoraDecodeConfig | None = None) -> torch.Tensor:
    """out (rows, N) += for each row r of a block, scaling[slot] * x[r] @ A[slot]^T @ B[slot]^T; a (slots, W, K),
    b (slots, N, W) block diagonal over `parts` (None: one part); block_slots (blocks,), block_rows
    (blocks * config.block_m,) (lora/blocks.py's PaddedLayout). The grids depend on the shapes and the number of
    blocks only: a CUDA graph replays any mix written into the same table."""
    config = config or LoraDecodeConfig()
    check_lora_args(out, x, a, b)
    partials = decode_shrink(x, a, block_slots, block_rows, config)
    return decode_expand(out, partials, b, block_slots, block_rows, scalings, parts, config, x.dtype)
