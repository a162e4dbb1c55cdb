"""The interface every attention backend implements (torch_native now, Triton on CUDA later)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.layers.radix_attention import RadixAttention
    from radixlm.runtime.layers.rotary import RotaryEmbedding


class AttentionBackend(ABC):
    supports_cuda_graph = False  # decode metadata that depends on nothing but device tensors
    # ForwardBatch.tree_masks honoured in REQUEST_SPANS (tree drafts); without it EAGLE drafts chains.
    supports_tree_mask = False
    # ForwardBatch.shared_prefixes honoured in eager decode passes (each group's prefix KV read once).
    supports_shared_prefix = False

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Called once per batch, before the model's forward; may set forward_batch.attn_metadata."""

    def init_forward_metadata_static(self, forward_batch: "ForwardBatch") -> None:
        """Decode metadata for a captured CUDA graph: valid for every sequence length the graph will see."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
        rotary: tuple["RotaryEmbedding", torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """q: (num_tokens, num_heads * head_dim); k, v: (num_tokens, num_kv_heads * head_dim).
        rotary: (rope, positions) to rotate q and k with first (with the KV store in one kernel where the pool can).
        Writes k, v into the pool at out_cache_loc (if save_kv_cache), then attends each new token to its
        request's whole sequence so far (causal). Returns (num_tokens, num_heads * head_dim)."""
        if rotary is not None:
            rope, positions = rotary
            fb = forward_batch
            if save_kv_cache and fb.token_to_kv_pool.set_rotated_kv_buffer(layer.layer_id, fb.out_cache_loc, q, k, v,
                                                                           rope, positions):
                save_kv_cache = False
            else:
                q, k = rope(positions, q, k)
        if forward_batch.forward_mode.is_token_rows():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    @abstractmethod
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor: ...
