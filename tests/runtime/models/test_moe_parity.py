"""Mixture-of-experts models against transformers on tiny random configs (float32, CPU): Mixtral, Qwen2-MoE (shared
expert, one dense layer through mlp_only_layers, qkv bias, no renormalisation) and Qwen3-MoE (qk-norm, renormalised
top-k, a dense layer through decoder_sparse_step). The model is saved as safetensors and served by radixlm's offline
Engine: a batch of prompts of different lengths must give transformers' greedy tokens (one prompt at a time) exactly,
and their logprobs within 1e-3; the logits of one forward pass match to 1e-4."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, MixtralConfig, PreTrainedTokenizerFast, Qwen2MoeConfig, Qwen3MoeConfig

import radixlm
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import load_model

VOCAB = 211
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False)
ARCH = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
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


def _randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                p.copy_(noise * 0.08)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.1 * noise)  # biases (HF's zero init would hide a mis-load)


def _word_tokenizer(path, vocab_size: int) -> None:
    """A word-level tokenizer t0 .. t{n-1}: the engine needs one; prompts are token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(path)


def save_tiny_moe(config, path, seed: int = 0):
    config.architectures = [ARCH[config.model_type]]
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    _randomize(hf, seed)
    hf.eval()
    hf.save_pretrained(path, safe_serialization=True)
    _word_tokenizer(path, config.vocab_size)
    return hf


def _prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _hf_greedy(hf, prompts, eos_ids) -> list[tuple[list[int], list[float]]]:
    eos = sorted(eos_ids) or None
    out = []
    with torch.inference_mode():
        for ids in prompts:
            gen = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)
            new = gen.sequences[0, len(ids):].tolist()
            lps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(gen.logits, new)]
            out.append((new, lps))
    return out


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
