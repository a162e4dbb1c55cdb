"""Split-K sizing of the decode kernel. Imports no Triton: the attention backend sizes CUDA graphs' splits with it."""
from __future__ import annotations

DECODE_BLOCK_N = 64  # sequence positions per block of the decode kernel's stage 1


def decode_num_splits(max_seq_len: int, bs: int, num_kv_heads: int, block_n: int = DECODE_BLOCK_N) -> int:
    """Enough programs to fill the GPU at small batch sizes, never splits shorter than a few blocks."""
    return max(1, min(16, -(-max_seq_len // (4 * block_n)), -(-256 // max(1, bs * num_kv_heads))))
