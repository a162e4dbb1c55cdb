"""INT4 checkpoints (AWQ, GPTQ act-order on/off, sym/asym, v1/v2, compressed-tensors W4A16) of tiny dense and MoE
models: radixlm's greedy tokens equal, token for token in float32, transformers' on a float model whose weights are
the dequantized weights; the logits of one pass agree for every GPTQ variant; modules_to_not_convert stays float."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig

import radixlm
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import load_model
from tests.runtime.models.tiny import hf_greedy, random_prompts, save_tiny
from tests.runtime.quantization.int4_checkpoints import Int4Spec, quantize_checkpoint

VOCAB = 97
NEW_TOKENS = 8
PROMPT_LENS = [3, 11, 20]
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)


def tiny_config(kind: str):
    if kind == "llama":
        return LlamaConfig(**COMMON, intermediate_size=96)
    if kind == "qwen2":
        return Qwen2Config(**COMMON, intermediate_size=128)
    if kind == "mixtral":
        return MixtralConfig(**COMMON, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)
    return Qwen2MoeConfig(**COMMON, intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, shared_expert_intermediate_size=32, norm_topk_prob=False)


def make_int4(tmp_path, kind: str, spec: Int4Spec, seed: int = 0):
    """(the INT4 checkpoint's dir, the dequantized float checkpoint's dir)."""
    src, dst, ref = tmp_path / "float", tmp_path / "int4", tmp_path / "ref"
    save_tiny(tiny_config(kind), src, seed=seed)
    quantize_checkpoint(src, dst, ref, spec)
    return dst, ref


def reference_model(ref):
    return AutoModelForCausalLM.from_pretrained(str(ref), dtype=torch.float32, attn_implementation="eager").eval()


GREEDY_CASES = {
    "awq-llama-g32": ("llama", Int4Spec("awq", 32)),
    "awq-mixtral-g-1": ("mixtral", Int4Spec("awq", -1)),
    "gptq-llama-actorder-asym-v1": ("llama", Int4Spec("gptq", 32, sym=False, act_order=True, v1=True)),
    "gptq-qwen2-sym-v2": ("qwen2", Int4Spec("gptq", 64, sym=True, act_order=False, v1=False)),
    "gptq-qwen2moe-actorder-sym-v1": ("qwen2_moe", Int4Spec("gptq", 32, sym=True, act_order=True)),
    "ct-llama-asym-group": ("llama", Int4Spec("compressed-tensors", 32, sym=False)),
    "ct-qwen2moe-sym-channel": ("qwen2_moe", Int4Spec("compressed-tensors", -1, sym=True)),
    "ct-mixtral-asym-actorder": ("mixtral", Int4Spec("compressed-tensors", 32, sym=False, act_order=True)),
}


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_matches_dequantized_transformers(case, tmp_path):
    kind, spec = GREEDY_CASES[case]
    dst, ref = make_int4(tmp_path, kind, spec, seed=len(case))
    prompts = random_prompts(1, PROMPT_LENS, VOCAB)
    # the flag confirms the detected method (the Llama cases); the others are detected alone
    flag = {"quantization": spec.method} if kind == "llama" else {}
    engine = radixlm.Engine(str(dst), dtype="float32", device="cpu", random_seed=0, max_total_tokens=1024, **flag)
    try:
        assert engine.model_config.quant_config.method.value == spec.method
        results = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS},
                                  return_logprob=True)
        reference = hf_greedy(reference_model(ref), prompts, engine.model_config.eos_token_ids, NEW_TOKENS)
    finally:
        engine.shutdown()
    for res, (ref_ids, ref_lps) in zip(results, reference, strict=True):
        assert res["output_ids"] == ref_ids
        got = [lp for lp, _tok, _text in res["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, ref_lps)) < 1e-3


def _logits(model, ids):
    from tests.runtime.models.conftest import run_logits

    return run_logits(model, ids)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("v1", [False, True])
def test_gptq_variants_logits(act_order, sym, v1, tmp_path):
    dst, ref = make_int4(tmp_path, "llama", Int4Spec("gptq", 32, sym=sym, act_order=act_order, v1=v1), seed=3)
    model = load_model(ModelConfig.from_path(str(dst), dtype="float32"))
    proj = model.model.layers[0].self_attn.qkv_proj
    assert (getattr(proj, "perm", None) is not None) == act_order
    ids = torch.tensor(random_prompts(2, [17], VOCAB)[0])
    with torch.no_grad():
        want = reference_model(ref)(ids[None]).logits[0]
    torch.testing.assert_close(_logits(model, ids), want, rtol=1e-4, atol=1e-4)


def test_modules_to_not_convert_stay_float(tmp_path):
    spec = Int4Spec("awq", 32, skip=("down_proj",))
    dst, ref = make_int4(tmp_path, "llama", spec)
    model = load_model(ModelConfig.from_path(str(dst), dtype="float32"))
    layer = model.model.layers[0]
    assert layer.mlp.down_proj.quant_method is None and layer.mlp.down_proj.weight.dtype == torch.float32
    assert layer.mlp.gate_up_proj.quant_method is not None
    ids = torch.tensor(random_prompts(4, [9], VOCAB)[0])
    with torch.no_grad():
        want = reference_model(ref)(ids[None]).logits[0]
    torch.testing.assert_close(_logits(model, ids), want, rtol=1e-4, atol=1e-4)
