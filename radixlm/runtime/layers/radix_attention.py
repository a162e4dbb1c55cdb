"""The attention module models hold: it knows its shape and dispatches to the batch's backend."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.layers.rotary import RotaryEmbedding


class RadixAttention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int, layer_id: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.num_kv_heads = num_kv_heads
        self.layer_id = layer_id

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: "ForwardBatch",
                rotary: tuple["RotaryEmbedding", torch.Tensor] | None = None) -> torch.Tensor:
        """rotary: (rope, positions): q and k before their rotary embedding (see AttentionBackend.forward)."""
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, rotary=rotary)
