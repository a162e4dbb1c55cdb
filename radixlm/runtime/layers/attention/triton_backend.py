"""Attention on CUDA with Triton kernels over the paged KV pool: split-K decode, and extend (prefill chunks over a
cached prefix, and decode passes carrying jump-forward tokens) in one ragged launch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch


@dataclass
class TritonMetadata:
    max_seq_len: int  # decode: the split-K sizing
    max_extend_len: int = 0
    prefix_lens: torch.Tensor | None = None  # extend, on the device
    extend_lens: torch.Tensor | None = None


class TritonAttnBackend(AttentionBackend):
    def __init__(self, model_runner: object | None = None):
        self.model_runner = model_runner

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        max_len = max(fb.seq_lens_cpu, default=0)
        if fb.forward_mode.is_decode():
            fb.attn_metadata = TritonMetadata(max_len)
            return
        dev = fb.input_ids.device
        fb.attn_metadata = TritonMetadata(
            max_len, max(fb.extend_seq_lens_cpu, default=0),
            torch.tensor(fb.extend_prefix_lens_cpu, dtype=torch.int64, device=dev),
            torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int64, device=dev))

    def _metadata(self, fb: "ForwardBatch") -> TritonMetadata:
        if not isinstance(fb.attn_metadata, TritonMetadata):
            self.init_forward_metadata(fb)
        return fb.attn_metadata

    @staticmethod
    def _save_kv(k, v, layer, fb: "ForwardBatch", save_kv_cache: bool) -> None:
        if save_kv_cache and k is not None:
            fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        from radixlm.runtime.layers.attention.triton_ops.extend_attention import extend_attention

        fb = forward_batch
        # NOTE: the new tokens' K/V go to the pool first; the kernel reads every key through req_to_token.
        self._save_kv(k, v, layer, fb, save_kv_cache)
        meta = self._metadata(fb)
        o = extend_attention(
            q.reshape(-1, layer.num_heads, layer.head_dim), fb.token_to_kv_pool.get_key_buffer(layer.layer_id),
            fb.token_to_kv_pool.get_value_buffer(layer.layer_id), fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices, meta.prefix_lens, meta.extend_lens, fb.extend_start_loc, layer.scaling,
            meta.max_extend_len)
        return o.reshape(-1, layer.num_heads * layer.head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention

        fb = forward_batch
        self._save_kv(k, v, layer, fb, save_kv_cache)
        bs = fb.batch_size
        if bs == 0:
            return q.reshape(0, layer.num_heads * layer.head_dim)
        o = decode_attention(
            q.reshape(bs, layer.num_heads, layer.head_dim), fb.token_to_kv_pool.get_key_buffer(layer.layer_id),
            fb.token_to_kv_pool.get_value_buffer(layer.layer_id), fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices, fb.seq_lens, layer.scaling, self._metadata(fb).max_seq_len)
        return o.reshape(bs, layer.num_heads * layer.head_dim)
