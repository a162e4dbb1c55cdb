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
PROMPT_LENS = [3, 17, 9, 30, 12]
NEW_TOKENS = 12
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
# A pool that must retract, chunks of 8 tokens.
TIGHT = {"chunked_prefill_size": 8, "max_total_tokens": 96, "schedule_conservativeness": 0.05}


def yarn(mscale: float, mscale_all_dim: float) -> dict:
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
            "mscale": mscale, "mscale_all_dim": mscale_all_dim, "beta_fast": 32, "beta_slow": 1}


def configs(**mla) -> dict:
    """mla: overrides of the latent widths (the CUDA test's multiples of 16)."""
    common = {**COMMON, **mla}
    return {
        "v2-lite": DeepseekV2Config(**common, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=2,
                                    n_shared_experts=2, topk_method="greedy", norm_topk_prob=False),
        "v2": DeepseekV2Config(**common, q_lora_rank=24, attention_bias=True, n_routed_experts=8,
                               num_experts_per_tok=3, n_shared_experts=1, topk_method="group_limited_greedy",
                               n_group=4, topk_group=2, routed_scaling_factor=1.5, rope_parameters=yarn(0.707, 0.707)),
        "v3": DeepseekV3Config(**common, q_lora_rank=24, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["v2-lite", "v3"])
def test_mla_kernels_and_graphs_on_cuda_equal_the_cpu(name, tmp_path):
    """The Triton MLA kernels (decode in CUDA graphs, extend over cached prefixes, chunks and retraction) against the
    torch path on the CPU, same weights, float32 (the kernels' dots run in TF32: logprobs within 2e-2)."""
    config = configs(qk_rope_head_dim=16)[name]  # the kernels take widths in multiples of 16
    save_deepseek(config, tmp_path, seed=3)
    prompts = prompts_without_pad(5)
    runs = {}
    for device in ("cpu", "cuda"):
        engine = radixlm.Engine(str(tmp_path), dtype="float32", device=device, random_seed=0, **TIGHT)
        try:
            graphs = engine.runner.graph_max_bs()
            first = engine.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
            again = engine.generate(input_ids=prompts[:4], sampling_params=GREEDY)
        finally:
            engine.shutdown()
        runs[device] = (graphs, first, again)
    assert runs["cuda"][0] > 0 and runs["cpu"][0] == 0
    for got, ref in zip(runs["cuda"][1], runs["cpu"][1], strict=True):
        assert got["output_ids"] == ref["output_ids"]
        lps = [(a[0], b[0]) for a, b in zip(got["meta_info"]["output_token_logprobs"],
                                            ref["meta_info"]["output_token_logprobs"])]
        assert max(abs(a - b) for a, b in lps) < 2e-2
    assert [r["output_ids"] for r in runs["cuda"][2]] == [r["output_ids"] for r in runs["cpu"][2]]


def test_layers_names_and_routing_from_the_config():
    """Which layers are sparse (first_k_dense_replace, moe_layer_freq), the routing each architecture reads, the
    checkpoint names our fused parameters take, and V3's MTP layers left out of loading."""
    from radixlm.runtime.kernels.moe import GroupScore, ScoringFunc
    from radixlm.runtime.models.deepseek_v2 import DeepseekV2MoE, DeepseekV3ForCausalLM, routing_of
    from radixlm.runtime.models.llama import LlamaMLP

    config = configs()["v3"]
    config.num_hidden_layers, config.moe_layer_freq = 5, 2
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config)
    assert [type(layer.mlp) for layer in model.model.layers] == [LlamaMLP, LlamaMLP, DeepseekV2MoE, LlamaMLP,
                                                                 DeepseekV2MoE]
    routing = model.model.layers[2].mlp.experts.routing
    assert (routing.scoring, routing.groups.score, routing.renormalize, routing.routed_scaling_factor) == \
        (ScoringFunc.SIGMOID, GroupScore.TOP2_SUM, True, 2.5)
    assert model.model.layers[2].mlp.gate.e_score_correction_bias.dtype == torch.float32
    assert model.map_weight_name("model.layers.0.self_attn.kv_a_proj_with_mqa.weight") == \
        ("model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight", 1)
    assert model.map_weight_name("model.layers.2.mlp.experts.7.down_proj.weight") == \
        ("model.layers.2.mlp.experts.w2_weight", (7, "down"))
    assert model._is_mtp("model.layers.5.eh_proj.weight") and not model._is_mtp("model.layers.4.mlp.gate.weight")
    v2_lite = configs()["v2-lite"]
    assert routing_of(v2_lite, "softmax", "greedy") == (model.model.layers[2].mlp.experts.routing.__class__(
        2, False, ScoringFunc.SOFTMAX, None, 1.0), False)
    v2_lite.topk_method = "noaux"
    with pytest.raises(ValueError, match="unsupported topk_method 'noaux'"):
        routing_of(v2_lite, "softmax", "greedy")
    from radixlm.runtime.distributed.parallel import Parallel

    with torch.device("meta"), pytest.raises(ValueError, match=r"num_attention_heads \(4\) is less than"):
        DeepseekV3ForCausalLM(config, Parallel(tp_rank=0, tp_size=8))
