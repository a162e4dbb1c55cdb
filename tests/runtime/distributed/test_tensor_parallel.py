"""Tensor parallelism on 2 gloo ranks (the CPU stand-in for 2 GPUs), through the offline Engine (rank 0 on its
thread, rank 1 in a process): greedy outputs equal transformers' generate token for token in float32 — for Llama
(tied head over an odd vocabulary: padded vocab shards), Qwen2, Qwen3 with one KV head (replicated on both ranks),
Mixtral and Qwen3-MoE, also with whole experts per rank (--ep-size 2) — and equal TP=1's with the radix cache hitting,
chunked prefill, retraction, an abort and a regex-constrained request; and after a weight update from tensors, those
of the new weights."""
from __future__ import annotations

import pytest
from transformers import LlamaConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

import radixlm
from tests.runtime.models.tiny import hf_greedy, random_prompts, save_tiny

pytestmark = pytest.mark.slow

VOCAB = 211
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)
PROMPT_LENS = [3, 17, 9, 30]
NEW_TOKENS = 12
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS}


def _configs():
    return {
        "llama-tied": LlamaConfig(**COMMON, tie_word_embeddings=True, attention_bias=True),
        "qwen2": Qwen2Config(**COMMON, tie_word_embeddings=False, eos_token_id=1),  # grammars need a stop token
        "qwen3-one-kv-head": Qwen3Config(**{**COMMON, "num_key_value_heads": 1}, head_dim=32,
                                         tie_word_embeddings=False),
        "mixtral": MixtralConfig(**COMMON, tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2),
        "qwen3-moe": Qwen3MoeConfig(**COMMON, tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=32, head_dim=16, norm_topk_prob=True),
    }


def _engine(path, **kwargs) -> radixlm.Engine:
    kwargs = {"dtype": "float32", "device": "cpu", "random_seed": 0, "max_total_tokens": 2048,
              "enable_integrity_check": True, **kwargs}
    return radixlm.Engine(str(path), **kwargs)


def _assert_greedy(results, reference):
    for res, (ref_ids, ref_lps) in zip(results, reference, strict=True):
        assert res["output_ids"] == ref_ids
        got = [lp for lp, _tok, _text in res["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, ref_lps)) < 1e-3


@pytest.mark.parametrize("name, ep_size", [("llama-tied", 1), ("qwen2", 1), ("qwen3-one-kv-head", 1), ("mixtral", 1),
                                           ("qwen3-moe", 1), ("qwen3-moe", 2)])
def test_two_ranks_match_transformers(name, ep_size, tmp_path):
    hf = save_tiny(_configs()[name], tmp_path, seed=len(name))
    prompts = random_prompts(5, PROMPT_LENS, VOCAB)
    engine = _engine(tmp_path, tp_size=2, ep_size=ep_size)
    try:
        results = engine.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
        reference = hf_greedy(hf, prompts, engine.model_config.eos_token_ids, NEW_TOKENS)
        if name == "llama-tied":
            # New weights from tensors: each rank loads its slice (padded vocab shards of the tied head included).
            hf = save_tiny(_configs()[name], tmp_path / "next", seed=99)
            ok, message = engine.update_weights_from_tensor(list(hf.state_dict().items()))
            assert ok, message
            updated = engine.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
            _assert_greedy(updated, hf_greedy(hf, prompts, engine.model_config.eos_token_ids, NEW_TOKENS))
    finally:
        engine.shutdown()
    _assert_greedy(results, reference)


def _session(engine: radixlm.Engine, prompts) -> dict:
    """Everything the scheduling test compares between TP=2 and TP=1."""
    first = engine.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
    again = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    stream = engine.generate(input_ids=prompts[1], sampling_params={"temperature": 0, "max_new_tokens": 200,
                                                                     "ignore_eos": True}, stream=True, rid="gone")
    for i, _chunk in enumerate(stream):
        if i == 2:
            engine.abort_request("gone")
            break
    stream.close()
    constrained = engine.generate(input_ids=prompts[0], sampling_params={
        "temperature": 0, "max_new_tokens": 8, "regex": "(t1[0-9]|t7)+"})
    sampled = engine.generate(input_ids=prompts, sampling_params={"temperature": 0.8, "top_p": 0.9,
                                                                 "max_new_tokens": 8, "sampling_seed": 7})
    return {"first": [r["output_ids"] for r in first], "again": [r["output_ids"] for r in again],
            "cached": [r["meta_info"]["cached_tokens"] for r in again],
            "constrained": constrained["output_ids"], "sampled": [r["output_ids"] for r in sampled],
            "retractions": engine.scheduler.stats["retractions"], "error": engine._error}


def test_scheduling_features_under_two_ranks(tmp_path):
    """A pool small enough to retract, 8-token prefill chunks, the cache hit by the second round: TP=2 == TP=1."""
    hf = save_tiny(_configs()["qwen2"], tmp_path, seed=11)
    prompts = random_prompts(6, PROMPT_LENS * 2, VOCAB)
    tight = {"chunked_prefill_size": 8, "max_total_tokens": 160, "schedule_conservativeness": 0.05}
    runs = {}
    for tp in (2, 1):
        engine = _engine(tmp_path, tp_size=tp, **tight)
        try:
            runs[tp] = _session(engine, prompts)
            reference = hf_greedy(hf, prompts, engine.model_config.eos_token_ids, NEW_TOKENS)
        finally:
            engine.shutdown()
    assert runs[2]["first"] == [ids for ids, _ in reference]
    assert runs[2] == runs[1]
    assert runs[2]["error"] is None and runs[2]["retractions"] > 0
    assert runs[2]["again"] == runs[2]["first"] and sum(runs[2]["cached"]) > 0
    assert all(t in {7, *range(10, 20)} for t in runs[2]["constrained"]) and runs[2]["constrained"]
