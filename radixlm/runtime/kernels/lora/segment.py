"""The segment kernels of batched LoRA. Grid: (segment, block of its rows, block of output columns); a segment of
slot -1 (the base model) does nothing. The shrink writes x @ A^T (rows, parts * max_rank) in float32; the expand adds
scaling * (x @ A^T) @ B^T to the output in place. B is block diagonal over a fused layer's parts (lora/ops.py), so one
expand covers q|k|v or gate|up."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.lora.shapes import check_lora_args

BLOCK_M = 16
BLOCK_N = 32
BLOCK_K = 32


@triton.jit
def _shrink(x_ptr, a_ptr, xa_ptr, seg_start_ptr, seg_len_ptr, seg_slot_ptr, K, W, stride_xm, stride_as, stride_aw,
            stride_xam, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr,
            BLOCK_K: tl.constexpr):
    seg, mblk, wblk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(seg_slot_ptr + seg)
    start = tl.load(seg_start_ptr + seg)
    n = tl.load(seg_len_ptr + seg)
    if slot >= 0 and mblk * BLOCK_M < n:
        rm = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
        rw = wblk * BLOCK_W + tl.arange(0, BLOCK_W)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + (start + rm)[:, None] * stride_xm + (k0 + rk)[None, :],
                        mask=(rm[:, None] < n) & (k0 + rk[None, :] < K), other=0.0)
            a = tl.load(a_ptr + slot * stride_as + rw[None, :] * stride_aw + (k0 + rk)[:, None],
                        mask=(rw[None, :] < W) & (k0 + rk[:, None] < K), other=0.0)
            acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision=PRECISION)
        tl.store(xa_ptr + (start + rm)[:, None] * stride_xam + rw[None, :], acc,
                 mask=(rm[:, None] < n) & (rw[None, :] < W))


@triton.jit
def _expand(xa_ptr, b_ptr, out_ptr, scaling_ptr, seg_start_ptr, seg_len_ptr, seg_slot_ptr, N, W, stride_xam,
            stride_bs, stride_bn, stride_om, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_W: tl.constexpr):
    seg, mblk, nblk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(seg_slot_ptr + seg)
    start = tl.load(seg_start_ptr + seg)
    n = tl.load(seg_len_ptr + seg)
    if slot >= 0 and mblk * BLOCK_M < n:
        rm = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = nblk * BLOCK_N + tl.arange(0, BLOCK_N)
        rw = tl.arange(0, BLOCK_W)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for w0 in range(0, W, BLOCK_W):
            xa = tl.load(xa_ptr + (start + rm)[:, None] * stride_xam + (w0 + rw)[None, :],
                         mask=(rm[:, None] < n) & (w0 + rw[None, :] < W), other=0.0)
            b = tl.load(b_ptr + slot * stride_bs + rn[None, :] * stride_bn + (w0 + rw)[:, None],
                        mask=(rn[None, :] < N) & (w0 + rw[:, None] < W), other=0.0)
            acc += tl.dot(xa, b.to(tl.float32), input_precision=PRECISION)
        acc = acc * tl.load(scaling_ptr + slot)
        mask = (rm[:, None] < n) & (rn[None, :] < N)
        ptrs = out_ptr + (start + rm)[:, None] * stride_om + rn[None, :]
        base = tl.load(ptrs, mask=mask, other=0.0)
        tl.store(ptrs, (base.to(tl.float32) + acc).to(out_ptr.dtype.element_ty), mask=mask)


def segment_lora_add(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, seg_starts: torch.Tensor,
                     seg_lens: torch.Tensor, seg_slots: torch.Tensor, scalings: torch.Tensor,
                     max_seg_len: int) -> torch.Tensor:
    """out (rows, N) += per segment, scaling[slot] * x @ A[slot]^T @ B[slot]^T; a (slots, W, K), b (slots, N, W)."""
    rows, k, w, n = check_lora_args(out, x, a, b)
    num_segs = int(seg_starts.shape[0])
    if num_segs == 0 or max_seg_len == 0:
        return out
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    block_w = max(16, triton.next_power_of_2(min(w, 64)))
    xa = torch.empty(rows, w, dtype=torch.float32, device=x.device)
    m_blocks = triton.cdiv(max_seg_len, BLOCK_M)
    _shrink[(num_segs, m_blocks, triton.cdiv(w, block_w))](
        x, a, xa, seg_starts, seg_lens, seg_slots, k, w, x.stride(0), a.stride(0), a.stride(1), xa.stride(0),
        PRECISION=precision, BLOCK_M=BLOCK_M, BLOCK_W=block_w, BLOCK_K=BLOCK_K)
    _expand[(num_segs, m_blocks, triton.cdiv(n, BLOCK_N))](
        xa, b, out, scalings, seg_starts, seg_lens, seg_slots, n, w, xa.stride(0), b.stride(0), b.stride(1),
        out.stride(0), PRECISION=precision, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_W=block_w)
    return out
