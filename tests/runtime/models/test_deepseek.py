"""DeepSeek-V2 and V3 (multi-head latent attention over the latent KV pool, DeepSeek MoE routing) against transformers
on tiny random configs (float32, CPU), through the offline Engine with a pool small enough to retract, 8-token prefill
chunks and a second round that hits the radix cache: greedy tokens equal transformers' generate token for token.

  v2-lite: q_proj (no q LoRA), softmax greedy routing, no renormalisation, default rope;
  v2:      q LoRA (fused q_a / kv_a GEMM), attention biases, group_limited_greedy, YaRN with mscale = mscale_all_dim;
  v3:      q LoRA, sigmoid scores with a random e_score_correction_bias, grouped top-k (best two per group),
           renormalised and scaled weights, YaRN whose mscale differs from mscale_all_dim (rotary attention factor and
           softmax scale both corrected)."""
from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV3Config

import radixlm
from radixlm.runtime.cache.kv_pool import MLATokenToKVPool
from tests.runtime.models.tiny import hf_greedy, random_prompts, save_tiny

VOCAB = 211
MLA = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4,
              max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False, moe_intermediate_size=32,
              first_k_dense_replace=1, **MLA)
PROMPT_LENS = [3, 17, 9, 30] * 2
NEW_TOKENS = 12
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
# A pool that must retract, chunks of 8 tokens.
TIGHT = {"chunked_prefill_size": 8, "max_total_tokens": 160, "schedule_conservativeness": 0.05}


def yarn(mscale: float, mscale_all_dim: float) -> dict:
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
            "mscale": mscale, "mscale_all_dim": mscale_all_dim, "beta_fast": 32, "beta_slow": 1}


def configs() -> dict:
    return {
        "v2-lite": DeepseekV2Config(**COMMON, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=2,
                                    n_shared_experts=2, topk_method="greedy", norm_topk_prob=False),
        "v2": DeepseekV2Config(**COMMON, q_lora_rank=24, attention_bias=True, n_routed_experts=8,
                               num_experts_per_tok=3, n_shared_experts=1, topk_method="group_limited_greedy",
                               n_group=4, topk_group=2, routed_scaling_factor=1.5, rope_parameters=yarn(0.707, 0.707)),
        "v3": DeepseekV3Config(**COMMON, q_lora_rank=24, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                               n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                               rope_parameters=yarn(1.0, 0.8)),
    }


def prompts_without_pad(seed: int) -> list[list[int]]:
    """Token 0 is the pad id transformers' generate is given: a prompt holding it would be masked there."""
    return [[t + 1 for t in ids] for ids in random_prompts(seed, PROMPT_LENS, VOCAB - 1)]


def save_deepseek(config, path, seed: int):
    hf = save_tiny(config, path, seed)
    if config.model_type == "deepseek_v3":  # a bias that moves the choice (transformers initialises it to zero)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in hf.model.layers[config.first_k_dense_replace :]:
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=g) * 0.05)
        hf.save_pretrained(path, safe_serialization=True)
    return hf


@pytest.mark.parametrize("name", list(configs()))
def test_deepseek_greedy_matches_transformers(name, tmp_path):
    config = configs()[name]
    hf = save_deepseek(config, tmp_path, seed=len(name))
    prompts = prompts_without_pad(7)
    engine = radixlm.Engine(str(tmp_path), dtype="float32", device="cpu", random_seed=0, enable_integrity_check=True,
                            **TIGHT)
    try:
        pool, kv_bytes = engine.runner.token_to_kv_pool, engine.runner.kv_bytes_per_token()
        first = engine.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
        again = engine.generate(input_ids=prompts[:4], sampling_params=GREEDY)
        retractions = engine.scheduler.stats["retractions"]
        reference = hf_greedy(hf, prompts, engine.model_config.eos_token_ids, NEW_TOKENS)
    finally:
        engine.shutdown()
    assert isinstance(pool, MLATokenToKVPool) and pool.get_latent_buffer(0).shape[1:] == (1, 32 + 8)
    assert kv_bytes == config.num_hidden_layers * (32 + 8) * 4  # float32
    for res, (ref_ids, ref_lps) in zip(first, reference, strict=True):
        assert res["output_ids"] == ref_ids
        got = [lp for lp, _tok, _text in res["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, ref_lps)) < 1e-3
    assert sum(len(ids) for ids, _ in reference) > len(prompts) * 2  # not all stopped at once
    assert retractions > 0
    assert [r["output_ids"] for r in again] == [ids for ids, _ in reference[:4]]
    assert sum(r["meta_info"]["cached_tokens"] for r in again) > 0
