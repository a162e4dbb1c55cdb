"""A dense single-sequence attention backend and ForwardBatch builder for model parity tests."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.layers.attention.base import AttentionBackend


class DenseCausalBackend(AttentionBackend):
    """Ignores the KV pool: causal SDPA over one whole sequence, GQA by repeating KV heads."""

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, rotary=None):
        return super().forward(q, k, v, layer, forward_batch, save_kv_cache=False, rotary=rotary)  # no pool here

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        t = q.shape[0]
        q = q.view(t, layer.num_heads, layer.head_dim).transpose(0, 1)
        k = k.view(t, layer.num_kv_heads, layer.head_dim).transpose(0, 1)
        v = v.view(t, layer.num_kv_heads, layer.head_dim).transpose(0, 1)
        rep = layer.num_heads // layer.num_kv_heads
        k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=layer.scaling)
        return o.transpose(0, 1).reshape(t, layer.num_heads * layer.head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        raise NotImplementedError


def dense_forward_batch(input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> ForwardBatch:
    t = int(input_ids.shape[0])
    dev = input_ids.device
    if positions is None:
        positions = torch.arange(t, device=dev)
    return ForwardBatch(
        forward_mode=ForwardMode.REQUEST_SPANS,
        batch_size=1,
        input_ids=input_ids,
        positions=positions,
        req_pool_indices=torch.zeros(1, dtype=torch.int64, device=dev),
        seq_lens=torch.tensor([t], device=dev),
        seq_lens_cpu=[t],
        out_cache_loc=torch.arange(t, device=dev),
        req_to_token_pool=None,
        token_to_kv_pool=None,
        attn_backend=DenseCausalBackend(),
        extend_prefix_lens_cpu=[0],
        extend_seq_lens_cpu=[t],
        extend_start_loc=torch.zeros(1, dtype=torch.int64, device=dev),
    )


def run_logits(model, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    fb = dense_forward_batch(input_ids, positions)
    with torch.inference_mode():
        hidden = model(fb.input_ids, fb.positions, fb)
        return hidden.float() @ model.lm_head.weight.float().T


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def dense_logits():
    """run_logits(model, input_ids, positions=None) -> float32 logits (T, vocab)."""
    return run_logits
