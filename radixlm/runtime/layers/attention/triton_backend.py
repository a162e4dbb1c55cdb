"""Attention on CUDA: Triton split-K decode over the paged KV pool. Extend (prefill, and decode passes carrying
jump-forward tokens) still runs through the torch_native path until its Triton kernel lands."""
from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.runtime.layers.attention.torch_native import TorchNativeAttnBackend

if TYPE_CHECKING:
    from radixlm.runtime.executor.forward_batch import ForwardBatch


class TritonAttnBackend(TorchNativeAttnBackend):
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        if forward_batch.forward_mode.is_decode():
            forward_batch.attn_metadata = max(forward_batch.seq_lens_cpu, default=0)
        else:
            super().init_forward_metadata(forward_batch)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention

        fb = forward_batch
        self._save_kv(k, v, layer, fb, save_kv_cache)
        bs = fb.batch_size
        if bs == 0:
            return q.reshape(0, layer.num_heads * layer.head_dim)
        max_len = fb.attn_metadata if isinstance(fb.attn_metadata, int) else max(fb.seq_lens_cpu)
        o = decode_attention(
            q.reshape(bs, layer.num_heads, layer.head_dim), fb.token_to_kv_pool.get_key_buffer(layer.layer_id),
            fb.token_to_kv_pool.get_value_buffer(layer.layer_id), fb.req_to_token_pool.req_to_token,
            fb.req_pool_indices, fb.seq_lens, layer.scaling, max_len)
        return o.reshape(bs, layer.num_heads * layer.head_dim)
