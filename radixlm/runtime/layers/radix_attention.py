"""The attention module models hold: it knows its shape and dispatches to the batch's backend."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.runtime.kernels.gemm import EPILOGUE_MAX_ROWS, RotaryStore

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
        # A float8 KV cache's scales of this layer (the checkpoint's k_scale / v_scale, else 1.0): plain floats, not
        # parameters; the model runner hands them to the KV pool, which ignores them unless it stores float8.
        self.k_scale = 1.0
        self.v_scale = 1.0

    def qkv_epilogue(self, forward_batch: "ForwardBatch",
                     rotary: tuple["RotaryEmbedding", torch.Tensor]) -> RotaryStore | None:
        """The rotation and KV store of this pass, for the qkv GEMM to apply (kernels/gemm/epilogue.py); None where no
        kernel can (not on CUDA, more rows than epilogue.MAX_ROWS) or the pass stores no KV."""
        rope, positions = rotary
        pool = forward_batch.token_to_kv_pool
        if (not positions.is_cuda or positions.shape[-1] > EPILOGUE_MAX_ROWS or pool is None
                or forward_batch.out_cache_loc is None):
            return None
        if forward_batch.layer_loads is not None:  # the GEMM stores this layer's KV: its loads come first
            forward_batch.layer_loads.wait(self.layer_id)
        scales = pool.kv_scales(self.layer_id)
        return RotaryStore(rope, positions, forward_batch.out_cache_loc, pool.get_key_buffer(self.layer_id),
                           pool.get_value_buffer(self.layer_id), self.num_heads * self.head_dim,
                           self.num_kv_heads * self.head_dim, scales.k_scale, scales.v_scale)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: "ForwardBatch",
                rotary: tuple["RotaryEmbedding", torch.Tensor] | None = None,
                epilogue: RotaryStore | None = None) -> torch.Tensor:
        """rotary: (rope, positions): q and k before their rotary embedding (see AttentionBackend.forward), unless
        the qkv GEMM applied `epilogue` (q and k rotated, the KV stored)."""
        if forward_batch.layer_loads is not None:  # KV loaded back into the pool: this layer's has arrived
            forward_batch.layer_loads.wait(self.layer_id)
        if epilogue is not None and epilogue.applied:
            return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache=False)
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, rotary=rotary)
