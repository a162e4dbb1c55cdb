"""The step after the qkv GEMM (the rotary embedding of q and k, and the KV store of the rotated k and of v), handed
to the GEMM as data: the skinny kernel of one-row passes applies it to its output (one launch fewer a layer);
otherwise attention rotates and stores as before (AttentionBackend.forward)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.layers.rotary import RotaryEmbedding


MAX_ROWS = 1  # the skinny kernel's epilogue reads row 0 alone


def kernel_args(epilogue: "RotaryStore | None", placeholder: torch.Tensor) -> tuple[tuple, tuple, int]:
    """epilogue.kernel_args, or without one the placeholder tensor for its pointers and zeros (unit scales)."""
    if epilogue is not None:
        return epilogue.kernel_args(placeholder.device)
    return (placeholder,) * 5, (0, 0, 0, 0, 0, 1.0, 1.0), 0


def kernel_head_dim(head_dim: int) -> bool:
    """Whether the skinny kernel's column blocks (4-32 columns, half of them in each half of a head) tile the head."""
    return head_dim % 64 == 0


@dataclass
class RotaryStore:
    """Built per pass and layer by RadixAttention.qkv_epilogue."""

    rope: "RotaryEmbedding"
    positions: torch.Tensor  # (rows,)
    loc: torch.Tensor  # (rows,) the new tokens' KV slots
    k_buf: torch.Tensor  # (slots, num_kv_heads, head_dim): the layer's pool buffers
    v_buf: torch.Tensor
    q_size: int  # q's columns in the GEMM's output, then kv_size of k and kv_size of v
    kv_size: int
    k_scale: float = 1.0  # a float8 pool's layer scales: it stores k / k_scale (kernels.elementwise.kv_cache_value)
    v_scale: float = 1.0
    applied: bool = False  # set by the GEMM that applied it: its q and k are rotated and the KV is stored

    @property
    def head_dim(self) -> int:
        return self.rope.head_size

    def fits(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether a kernel can apply it to x @ weight.T: CUDA, neox rotation over whole heads of a width that splits
        into the kernel's column blocks, the GEMM's output is [q | k | v], the pool holds contiguous rows."""
        d = self.head_dim
        return (x.is_cuda and self.rope.fused(self.positions, x) and kernel_head_dim(d)
                and weight.shape[0] == self.q_size + 2 * self.kv_size and self.q_size % d == 0
                and self.positions.shape == self.loc.shape == x.shape[:1]
                and all(b.is_contiguous() and b.shape[1] * b.shape[2] == self.kv_size
                        for b in (self.k_buf, self.v_buf)))

    def kernel_args(self, device: torch.device) -> tuple[tuple, tuple, int]:
        """What fused_steps.rotary_store takes from a kernel's arguments: (Pos, CosSin, Loc, KBuf, VBuf), (n_q, n_kv,
        stride_cs, stride_kb, stride_vb, k_scale, v_scale), HEAD_DIM."""
        cos_sin = self.rope.cos_sin_on(device)
        return ((self.positions, cos_sin, self.loc, self.k_buf, self.v_buf),
                (self.q_size, self.kv_size, cos_sin.stride(0), self.k_buf.stride(0), self.v_buf.stride(0),
                 float(self.k_scale), float(self.v_scale)), self.head_dim)

    def unfused(self, y: torch.Tensor) -> None:
        """The step on the GEMM's output y (rows, q_size + 2 * kv_size) by the rotary kernel (where fits()), in place:
        what attention runs when the GEMM did not apply it."""
        q, k, v = y.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        self.rope.rotate_and_store_(self.positions, q, k, v, self.loc, self.k_buf, self.v_buf, self)
