"""Our models vs transformers on tiny random configs, loaded through our safetensors loader."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import load_model
from tests.runtime.models.tiny import save_tiny

COMMON = dict(
    vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
)


def _configs():
    return {
        "llama3-rope": LlamaConfig(
            **COMMON, tie_word_embeddings=False, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
        ),
        "llama-bias-tied": LlamaConfig(**COMMON, tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
        "mistral": MistralConfig(**COMMON, tie_word_embeddings=False, sliding_window=None, head_dim=16),
        "qwen2-tied": Qwen2Config(**COMMON, tie_word_embeddings=True, rope_theta=1e6),
        "qwen2-untied": Qwen2Config(**COMMON, tie_word_embeddings=False),
        "qwen3": Qwen3Config(**{**COMMON, "num_key_value_heads": 1}, head_dim=32, tie_word_embeddings=False),
    }


def save_tiny_hf_model(config, path, seed: int = 0):
    return save_tiny(config, path, seed)


@pytest.mark.parametrize("name", list(_configs()))
def test_tiny_parity_with_transformers(name, tmp_path, dense_logits):
    config = _configs()[name]
    hf = save_tiny_hf_model(config, tmp_path)
    mc = ModelConfig.from_path(str(tmp_path), dtype="float32")
    model = load_model(mc)
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, config.vocab_size, (23,), generator=torch.Generator().manual_seed(1))
    # Large positions exercise the rope scaling bands (llama3) that short prompts barely touch.
    positions = torch.arange(23) + (3000 if name == "llama3-rope" else 0)
    with torch.no_grad():
        ref = hf(ids[None], position_ids=positions[None]).logits[0].float()
    ours = dense_logits(model, ids, positions)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_transformers(dtype, tmp_path, dense_logits):
    config = _configs()["qwen2-untied"]
    save_tiny_hf_model(config, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype, attn_implementation="eager").eval()
    mc = ModelConfig.from_path(str(tmp_path), dtype="bfloat16" if dtype == torch.bfloat16 else "float16")
    model = load_model(mc)
    assert model.model.embed_tokens.weight.dtype == dtype
    ids = torch.randint(0, config.vocab_size, (17,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    ours = dense_logits(model, ids)
    assert torch.isfinite(ours).all()
    tol = 0.05 if dtype == torch.bfloat16 else 0.01
    assert (ours - ref).abs().max().item() < tol * ref.abs().max().item()
