"""MLA's pieces against their references: the absorbed latent attention (layers.attention.mla, torch path) against
the expanded form (K and V rebuilt per head from the latent, plain causal attention, float64) for extend passes over a
cached prefix and for decode rows; DeepSeek's YaRN rotary (inv_freq, attention factor, the softmax scale's mscale)
and its interleaved rotation against transformers."""
from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

from radixlm.runtime.cache.kv_pool import MLATokenToKVPool
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.layers.attention.mla import latent_attention
from radixlm.runtime.layers.mla import mla_softmax_scale
from radixlm.runtime.layers.rotary import get_rope

RANK, ROPE, NOPE, V, HEADS, LAYER = 16, 8, 12, 10, 3, 1
SCALE = (NOPE + ROPE) ** -0.5


def _expanded_reference(q_nope, q_pe, latent, w_uk, w_uv, prefix: int) -> torch.Tensor:
    """Unabsorbed MLA in float64: k = [W_UK c_kv | k_pe], v = W_UV c_kv per head, causal over prefix + new rows.
    q_nope (ext, H, nope), q_pe (ext, H, rope), latent (seq, rank + rope) -> (ext, H, v)."""
    q_nope, q_pe, latent, w_uk, w_uv = (x.double() for x in (q_nope, q_pe, latent, w_uk, w_uv))
    c_kv, k_pe = latent[:, :RANK], latent[:, RANK:]
    k_nope = torch.einsum("hnr,sr->shn", w_uk, c_kv)
    v = torch.einsum("hvr,sr->shv", w_uv, c_kv)
    scores = (torch.einsum("thn,shn->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_pe, k_pe)) * SCALE
    ext, seq = q_nope.shape[0], latent.shape[0]
    allowed = torch.arange(seq)[None, :] <= (prefix + torch.arange(ext))[:, None]
    return torch.einsum("hts,shv->thv", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("mode", [ForwardMode.REQUEST_SPANS, ForwardMode.TOKEN_ROWS])
def test_absorbed_latent_attention_equals_the_expanded_form(mode):
    g = torch.Generator().manual_seed(0)
    lens = [(5, 4), (0, 6), (9, 1)] if mode is ForwardMode.REQUEST_SPANS else [(5, 1), (0, 1), (12, 1)]
    pool = MLATokenToKVPool(128, 4, torch.float32, 2, RANK, ROPE)
    alloc, table = TokenToKVPoolAllocator(128, 4), ReqToTokenPool(6, 32)
    table.alloc()  # request rows are not 0..bs-1
    w_uk, w_uv = torch.randn(HEADS, NOPE, RANK, generator=g), torch.randn(HEADS, V, RANK, generator=g)
    rows, latents, new_slots = [], [], []
    for prefix, ext in lens:
        row, seq = table.alloc(), prefix + ext
        slots = alloc.alloc_extend([0], [seq], [-1])
        table.req_to_token[row, :seq] = slots
        latent = torch.randn(seq, RANK + ROPE, generator=g)
        pool.set_mla_kv_buffer(LAYER, slots, latent[:, :RANK], latent[:, RANK:])  # the pass's rows stored too
        rows.append(row), latents.append(latent), new_slots.append(slots[prefix:])
    q_nope = torch.randn(sum(e for _, e in lens), HEADS, NOPE, generator=g)
    q_pe = torch.randn(q_nope.shape[0], HEADS, ROPE, generator=g)
    fb = ForwardBatch(
        forward_mode=mode, batch_size=len(lens), input_ids=torch.zeros(q_nope.shape[0], dtype=torch.long),
        positions=torch.zeros(q_nope.shape[0], dtype=torch.long), req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor([p + e for p, e in lens]), seq_lens_cpu=[p + e for p, e in lens],
        out_cache_loc=torch.cat(new_slots), req_to_token_pool=table, token_to_kv_pool=pool, attn_backend=None,
        extend_prefix_lens_cpu=[p for p, _ in lens], extend_seq_lens_cpu=[e for _, e in lens])
    q = torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe], dim=-1)
    o_latent = latent_attention(q, pool.get_latent_buffer(LAYER), fb, SCALE, RANK)
    got = torch.einsum("thr,hvr->thv", o_latent, w_uv)
    start = 0
    for (prefix, ext), latent in zip(lens, latents):
        want = _expanded_reference(q_nope[start : start + ext], q_pe[start : start + ext], latent, w_uk, w_uv, prefix)
        torch.testing.assert_close(got[start : start + ext].double(), want, rtol=1e-4, atol=1e-4)
        start += ext
    with pytest.raises(ValueError, match="latent cache"):
        latent_attention(q[:, :, :-1], pool.get_latent_buffer(LAYER), fb, SCALE, RANK)


def _v3_config(**rope) -> DeepseekV3Config:
    return DeepseekV3Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, qk_nope_head_dim=NOPE,
                            qk_rope_head_dim=ROPE, v_head_dim=V, kv_lora_rank=RANK, q_lora_rank=None,
                            max_position_embeddings=2048, rope_parameters={"rope_theta": 10000.0, **rope})


@pytest.mark.parametrize("mscale, mscale_all_dim", [(1.0, 1.0), (1.0, 0.8), (None, None)])
def test_yarn_rope_and_softmax_scale_match_transformers(mscale, mscale_all_dim):
    rope = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256, "beta_fast": 32,
            "beta_slow": 1}
    if mscale is not None:
        rope.update(mscale=mscale, mscale_all_dim=mscale_all_dim)
    config = _v3_config(**rope)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    ours = get_rope(ROPE, 2048, 10000.0, config.rope_parameters, interleaved=True)
    assert ours.attention_factor == pytest.approx(attention_factor, rel=1e-12)
    pos = torch.tensor([0, 1, 300, 2047])
    freqs = pos[:, None].float() * inv_freq[None, :]
    want = torch.cat([freqs.cos(), freqs.sin()], -1) * attention_factor
    torch.testing.assert_close(ours.cos_sin_cache[pos], want, rtol=1e-5, atol=1e-5)
    assert mla_softmax_scale(config, config.rope_parameters) == pytest.approx(
        DeepseekV3Attention(config, 0).scaling, rel=1e-12)


def test_interleaved_rotation_is_transformers_deepseek_v2():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(5, HEADS, ROPE, generator=g), torch.randn(5, 1, ROPE, generator=g)
    pos = torch.tensor([0, 3, 7, 100, 511])
    rope = get_rope(ROPE, 512, 10000.0, interleaved=True)
    got_q, got_k = rope(pos, q.reshape(5, -1), k.reshape(5, -1))
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, ROPE, 2).float() / ROPE))
    freqs_cis = torch.polar(torch.ones(5, ROPE // 2), pos[:, None].float() * inv_freq)
    # transformers: (batch, heads, seq, dim) with freqs (batch, seq, dim / 2)
    want_q, want_k = apply_rotary_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], freqs_cis[None])
    torch.testing.assert_close(got_q.view(5, HEADS, ROPE), want_q[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k.view(5, 1, ROPE), want_k[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
