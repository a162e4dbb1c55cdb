"""Shared layers vs the transformers reference ops, the registry, and dummy-weight forwards."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from radixlm.runtime.layers.activation import SiluAndMul
from radixlm.runtime.layers.norm import RMSNorm
from radixlm.runtime.layers.rotary import get_rope, rope_params_from_config
from radixlm.runtime.models.registry import get_model_class


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_hf_with_fused_residual(dtype):
    g = torch.Generator().manual_seed(0)
    w = 1 + 0.1 * torch.randn(48, generator=g)
    x = torch.randn(5, 48, generator=g).to(dtype)
    res = torch.randn(5, 48, generator=g).to(dtype)
    ref = LlamaRMSNorm(48, eps=1e-5).to(dtype)
    ours = RMSNorm(48, eps=1e-5).to(dtype)
    with torch.no_grad():
        ref.weight.copy_(w)
        ours.weight.copy_(w)
        assert torch.equal(ours(x), ref(x))
        normed, new_res = ours(x, res)
        assert torch.equal(new_res, x + res)
        assert torch.equal(normed, ref(x + res))


ROPE_CASES = {
    "default": dict(rope_theta=10000.0),
    "llama3": dict(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024}),
    "linear": dict(rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0}),
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_matches_hf(case, dtype):
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192, **ROPE_CASES[case])
    head_dim = 64
    theta, scaling = rope_params_from_config(cfg)
    rope = get_rope(head_dim, cfg.max_position_embeddings, theta, scaling)
    g = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 7, 100, 1023, 1024, 4000, 8191])
    q = torch.randn(len(positions), 4 * head_dim, generator=g).to(dtype)
    k = torch.randn(len(positions), 2 * head_dim, generator=g).to(dtype)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(
        q.view(1, -1, 4, head_dim).transpose(1, 2), k.view(1, -1, 2, head_dim).transpose(1, 2), cos, sin)
    q_ours, k_ours = rope(positions, q, k)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(q_ours, q_ref.transpose(1, 2).reshape(q.shape), atol=tol, rtol=tol)
    torch.testing.assert_close(k_ours, k_ref.transpose(1, 2).reshape(k.shape), atol=tol, rtol=tol)


def test_unsupported_rope_type():
    with pytest.raises(ValueError, match="longrope"):
        get_rope(64, 128, 10000.0, {"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        get_rope(64, 128, 10000.0, {"rope_type": "yarn", "factor": 2.0})


def test_silu_and_mul():
    x = torch.randn(3, 10)
    assert torch.allclose(SiluAndMul()(x), F.silu(x[:, :5]) * x[:, 5:])


def test_registry_names_unknown_architecture():
    assert get_model_class("Qwen3ForCausalLM").__name__ == "Qwen3ForCausalLM"
    with pytest.raises(ValueError, match=r"'GPT2LMHeadModel'.*LlamaForCausalLM.*Qwen2ForCausalLM"):
        get_model_class("GPT2LMHeadModel")


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dummy_weights_give_finite_logits(arch, dtype, dense_logits):
    from radixlm.runtime.model_loader.loader import _default_dtype, initialize_dummy_weights

    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    with _default_dtype(dtype):
        model = get_model_class(arch)(cfg)
    initialize_dummy_weights(model)
    assert all(p.dtype == dtype for p in model.parameters())
    logits = dense_logits(model, torch.arange(12) % 101)
    assert logits.shape == (12, 101) and torch.isfinite(logits).all()


def test_empty_batch_forward():
    from radixlm.runtime.model_loader.loader import initialize_dummy_weights

    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = get_model_class("Qwen3ForCausalLM")(cfg)
    initialize_dummy_weights(model)

    class EchoBackend:
        def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, rotary=None):
            return q

    class Batch:
        attn_backend = EchoBackend()
        input_embeds = None
        layer_loads = None

    empty = torch.zeros(0, dtype=torch.int64)
    assert model(empty, empty, Batch()).shape == (0, 32)
