"""What both LoRA kernels' hosts check, and the gather form's block size (no Triton: lora/ reads it on any device)."""
from __future__ import annotations

import torch

# Rows per block of the gather form (CUDA-graph decode): the gather kernels' BLOCK_M, which a block never exceeds.
GATHER_BLOCK_ROWS = 16


def check_lora_args(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    min_rows: int | None = None) -> tuple[int, int, int, int]:
    """(rows, K, W, N) of `out (rows, N) += x (rows, K) @ A[slot]^T (slots, W, K) @ B[slot]^T (slots, N, W)`; a
    ValueError when the shapes do not fit or a row is not contiguous. min_rows: an index that must cover every row."""
    rows, k = x.shape
    slots, w, k_a = a.shape
    n = b.shape[1]
    if k_a != k or b.shape != (slots, n, w) or out.shape != (rows, n) or (min_rows is not None and min_rows < rows):
        raise ValueError(f"LoRA shapes do not fit: x {tuple(x.shape)}, A {tuple(a.shape)}, B {tuple(b.shape)}, "
                         f"out {tuple(out.shape)}" + ("" if min_rows is None else f", {min_rows} sorted rows"))
    if not (x.stride(1) == a.stride(2) == b.stride(2) == out.stride(1) == 1):
        raise ValueError("LoRA kernels need rows with unit column stride")
    return rows, k, w, n
