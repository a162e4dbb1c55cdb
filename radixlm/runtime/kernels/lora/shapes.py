"""What the LoRA kernels' hosts check, and the blocks' sizes (no Triton: lora/ reads them on any device)."""
from __future__ import annotations

import torch

# Rows per block of gather.py's graph form (graph decode before kernels/lora/decode.py; the decode sweep's old path).
GATHER_BLOCK_ROWS = 16
# Rows per block of eager passes (prefill, extend): whole tiles of a prompt's rows.
EAGER_BLOCK_ROWS = 64


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


def check_parts(parts: tuple[int, ...] | None, n: int, w: int) -> tuple[int, ...]:
    """The fused parts' output sizes (None: one part of n), checked against B's (n, w): 1 to 3 parts summing to n,
    each with its rank block of w / parts columns."""
    parts = (n,) if parts is None else tuple(parts)
    if not 1 <= len(parts) <= 3 or sum(parts) != n or min(parts) < 0 or w % len(parts):
        raise ValueError(f"LoRA parts {parts} do not split B's ({n}, {w}) into 1 to 3 blocks")
    return parts
