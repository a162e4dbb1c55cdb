"""The attention backend of --enable-deterministic-inference: every pass, in either layout, runs the batch-invariant
attention (kernels/attention/fixed_split.py: the Triton kernel on CUDA, the torch implementation elsewhere), so a
row's output is the same whether it is a prefill, a chunk, an extend over a radix-cache hit, a decode step or a
CUDA-graph replay, and whatever else the pass holds. It takes no tree masks (EAGLE drafts chains then) and no shared
prefixes (eager decode passes read each row's prefix itself), and attends causally only."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.kernels.attention import fixed_split_attention_torch, row_requests
from radixlm.runtime.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.layers.radix_attention import RadixAttention


@dataclass(frozen=True)
class FixedSplitMetadata:
    row_req: torch.Tensor  # (num_tokens,): each row's req_to_token row (the rows' positions: ForwardBatch.positions)


class DeterministicAttnBackend(AttentionBackend):
    supports_cuda_graph = True  # the metadata is a view of the graph's static request rows

    def __init__(self, model_runner: object | None = None):
        self.model_runner = model_runner

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        if fb.tree_masks is not None and any(t is not None for t in fb.tree_masks):
            raise ValueError("deterministic attention takes no tree masks (its backend declares none)")
        spans = None if fb.forward_mode.is_token_rows() else fb.extend_seq_lens_cpu
        fb.attn_metadata = FixedSplitMetadata(row_requests(fb.req_pool_indices, spans, fb.num_tokens))

    def init_forward_metadata_static(self, forward_batch: "ForwardBatch") -> None:
        forward_batch.attn_metadata = FixedSplitMetadata(forward_batch.req_pool_indices)

    def _attend(self, q, k, v, layer: "RadixAttention", fb: "ForwardBatch", save_kv_cache: bool) -> torch.Tensor:
        if save_kv_cache and k is not None:
            fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        if not isinstance(fb.attn_metadata, FixedSplitMetadata):
            self.init_forward_metadata(fb)
        scales = fb.token_to_kv_pool.kv_scales(layer.layer_id)
        q = q.reshape(-1, layer.num_heads, layer.head_dim)
        k_buf = fb.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_buf = fb.token_to_kv_pool.get_value_buffer(layer.layer_id)
        args = (q, k_buf, v_buf, fb.req_to_token_pool.req_to_token, fb.attn_metadata.row_req,
                fb.positions[: q.shape[0]], layer.scaling * scales.k_scale, scales.v_scale)
        if q.is_cuda:
            from radixlm.runtime.kernels.attention import fixed_split_attention

            o = fixed_split_attention(*args)
        else:
            o = fixed_split_attention_torch(*args)
        return o.reshape(-1, layer.num_heads * layer.head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache)
