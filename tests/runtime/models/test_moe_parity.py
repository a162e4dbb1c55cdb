"""Mixture-of-experts models against transformers on tiny random configs (float32, CPU): Mixtral, Qwen2-MoE (shared
expert, one dense layer through mlp_only_layers, qkv bias, no renormalisation) and Qwen3-MoE (qk-norm, renormalised
top-k, a dense layer through decoder_sparse_step). The model is saved as safetensors and served by radixlm's offline
Engine: a batch of prompts of different lengths must give transformers' greedy tokens (one prompt at a time) exactly,
and their logprobs within 1e-3; the logits of one forward pass match to 1e-4."""
from __future__ import annotations

import pytest
import torch
from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

import radixlm
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import load_model
from tests.runtime.models.tiny import hf_greedy, random_prompts, save_tiny

VOCAB = 211
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False)
PROMPT_LENS = [3, 17, 9, 30]
NEW_TOKENS = 12


def _configs():
    return {
        "mixtral": MixtralConfig(**COMMON, num_hidden_layers=2, num_local_experts=6, num_experts_per_tok=2),
        "qwen2-moe": Qwen2MoeConfig(**COMMON, num_hidden_layers=3, num_experts=8, num_experts_per_tok=3,
                                    moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                    norm_topk_prob=False, mlp_only_layers=[1]),
        "qwen3-moe": Qwen3MoeConfig(**COMMON, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=32, head_dim=32, norm_topk_prob=True,
                                    decoder_sparse_step=2),
    }


def save_tiny_moe(config, path, seed: int = 0):
    return save_tiny(config, path, seed)


def _prompts(seed: int) -> list[list[int]]:
    return random_prompts(seed, PROMPT_LENS, VOCAB)


def _hf_greedy(hf, prompts, eos_ids) -> list[tuple[list[int], list[float]]]:
    return hf_greedy(hf, prompts, eos_ids, NEW_TOKENS)


@pytest.mark.parametrize("name", list(_configs()))
def test_moe_engine_greedy_matches_transformers(name, tmp_path, dense_logits):
    config = _configs()[name]
    hf = save_tiny_moe(config, tmp_path, seed=len(name))

    # One forward pass, logits.
    model = load_model(ModelConfig.from_path(str(tmp_path), dtype="float32"))
    ids = torch.tensor(_prompts(1)[3])
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    assert (dense_logits(model, ids) - ref).abs().max().item() < 1e-4
    del model

    # Greedy generation through the engine, the prompts batched.
    prompts = _prompts(2)
    engine = radixlm.Engine(str(tmp_path), dtype="float32", device="cpu", random_seed=0, max_total_tokens=2048,
                            enable_integrity_check=True)
    try:
        results = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS},
                                  return_logprob=True)
        reference = _hf_greedy(hf, prompts, engine.model_config.eos_token_ids)
    finally:
        engine.shutdown()
    for res, (ref_ids, ref_lps) in zip(results, reference):
        assert res["output_ids"] == ref_ids
        got = [lp for lp, _tok, _text in res["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, ref_lps)) < 1e-3
    assert sum(len(r) for r, _ in reference) >= len(prompts) * 2  # not all stopped at once


def test_moe_layers_as_transformers_decides():
    """Which layers are sparse, and what each rank would hold: read from our modules."""
    from radixlm.runtime.layers.moe import FusedMoE
    from radixlm.runtime.models.llama import LlamaMLP
    from radixlm.runtime.models.qwen_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

    configs = _configs()
    with torch.device("meta"):
        q2 = Qwen2MoeForCausalLM(configs["qwen2-moe"])
        q3 = Qwen3MoeForCausalLM(configs["qwen3-moe"])
    assert [type(layer.mlp.experts if hasattr(layer.mlp, "experts") else layer.mlp) for layer in q2.model.layers] == \
        [FusedMoE, LlamaMLP, FusedMoE]
    assert q2.model.layers[0].mlp.shared_expert is not None
    assert q2.model.layers[0].self_attn.qkv_proj.bias is not None
    assert q2.model.layers[0].self_attn.o_proj.bias is None
    assert [isinstance(layer.mlp, LlamaMLP) for layer in q3.model.layers] == [True, False]  # decoder_sparse_step=2
    assert q3.model.layers[1].mlp.shared_expert is None
    assert q3.model.layers[1].mlp.experts.renormalize is True
