"""DeepSeek-V2/V3 checkpoints quantized as DeepSeek ships V3 (FP8 blocks on every projection: the experts, the
dense and shared MLPs, and MLA's q_a / q_b, kv_a_proj_with_mqa, kv_b_proj and o_proj; the routers float). kv_b_proj,
whose views the absorbed attention multiplies as float weights, is dequantized once at load (DequantizedAtLoad);
the fused q_a | kv_a GEMM keeps its blocks. Greedy outputs through the offline Engine equal transformers' on the
dequantized weights, token for token (float32, CPU); INT4 (AWQ, GPTQ with act-order) the same way."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import radixlm
from radixlm.runtime.kernels.quant import FP8_DTYPE
from tests.runtime.models.test_deepseek import configs, prompts_without_pad, save_deepseek
from tests.runtime.models.tiny import hf_greedy
from tests.runtime.quantization import fp8_checkpoints as fp8
from tests.runtime.quantization.helpers import DEEPSEEK_PROJ, quantize_saved, reference_model
from tests.runtime.quantization.int4_checkpoints import Int4Spec, quantize_checkpoint

NEW_TOKENS = 8
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
# 8 x 8 blocks: the tiny configs' 24-row q_a (q_lora_rank) must end on a block for the fused q_a | kv_a GEMM, as
# V3's 1536 rows do on 128.
FP8_BLOCKS = (fp8.block(8, 8), {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [8, 8]})


def save_fp8_deepseek(name: str, path):
    save_deepseek(configs()[name], path, seed=5)
    return quantize_saved(path, *FP8_BLOCKS, names=DEEPSEEK_PROJ)


@pytest.mark.parametrize("name", ["v3", "v2-lite"])
def test_fp8_block_deepseek_matches_the_dequantized_model(name, tmp_path):
    hf = save_fp8_deepseek(name, tmp_path)
    prompts = prompts_without_pad(3)
    engine = radixlm.Engine(str(tmp_path), dtype="float32", device="cpu", random_seed=0, chunked_prefill_size=8)
    try:
        out = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        eos = engine.model_config.eos_token_ids
        attn = engine.runner.model.model.layers[1].self_attn
        experts = engine.runner.model.model.layers[1].mlp.experts
    finally:
        engine.shutdown()
    kv_b = attn.kv_b_proj
    assert kv_b.quant_method is None and [n for n, _ in kv_b.named_parameters()] == ["weight"]
    assert kv_b.weight.dtype == torch.float32 and tuple(kv_b.weight.shape) == (4, 32, 32)
    assert attn.o_proj.weight.dtype == FP8_DTYPE and experts.w13_weight.dtype == FP8_DTYPE
    if name == "v3":
        assert attn.fused_qkv_a_proj_with_mqa.weight.dtype == FP8_DTYPE
    reference = hf_greedy(hf, prompts, eos, NEW_TOKENS)
    assert [r["output_ids"] for r in out] == [ids for ids, _ in reference]


@pytest.mark.parametrize("spec", [Int4Spec("awq", 8), Int4Spec("gptq", 8, sym=False, act_order=True)],
                         ids=["awq", "gptq-actorder"])
def test_int4_deepseek_matches_the_dequantized_model(spec, tmp_path):
    """INT4 DeepSeek checkpoints (community AWQ / GPTQ releases quantize kv_b_proj too): kv_b_proj dequantized at
    load, act-order's channel permutation undone."""
    save_deepseek(configs()["v3"], tmp_path / "float", seed=5)
    quantize_checkpoint(tmp_path / "float", tmp_path / "int4", tmp_path / "ref", spec, names=DEEPSEEK_PROJ)
    hf = reference_model(tmp_path / "ref")
    prompts = prompts_without_pad(3)
    with radixlm.Engine(str(tmp_path / "int4"), dtype="float32", device="cpu", random_seed=0) as engine:
        out = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        eos = engine.model_config.eos_token_ids
        assert engine.runner.model.model.layers[1].self_attn.kv_b_proj.quant_method is None
    reference = hf_greedy(hf, prompts, eos, NEW_TOKENS)
    assert [r["output_ids"] for r in out] == [ids for ids, _ in reference]


def test_dummy_weights_quantize_kv_b_proj_as_the_float_dummy_model(tmp_path):
    """--load-format dummy on an FP8 DeepSeek: kv_b_proj drawn as the float dummy loader draws it, quantized to the
    blocks and dequantized back: within e4m3's rounding of the float dummy model's."""
    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.model_loader.loader import load_model

    save_fp8_deepseek("v3", tmp_path)
    cfg = ModelConfig.from_path(str(tmp_path), dtype="float32")
    quantized = load_model(cfg, "dummy")
    float_model = load_model(dataclasses.replace(cfg, quant_config=None), "dummy")
    got = quantized.model.layers[1].self_attn.kv_b_proj.weight
    want = float_model.model.layers[1].self_attn.kv_b_proj.weight
    assert ((got - want).abs().max() / want.abs().max()).item() < 0.07
    assert not torch.equal(got, want)  # quantized, not the float draw itself


def test_a_format_that_cannot_dequantize_kv_b_proj_is_refused(tmp_path, monkeypatch):
    from radixlm.runtime.model_loader.files import ModelLoadError
    from radixlm.runtime.quantization.base import LinearMethod
    from radixlm.runtime.quantization.fp8 import Fp8LinearMethod

    save_fp8_deepseek("v3", tmp_path)
    monkeypatch.setattr(Fp8LinearMethod, "dequantized_weight", LinearMethod.dequantized_weight)
    with pytest.raises(ModelLoadError, match="cannot be dequantized into a float layer"):
        radixlm.Engine(str(tmp_path), dtype="float32", device="cpu")


def test_a_weight_update_dequantizes_kv_b_proj_again(tmp_path):
    """update_weights_from_disk from the FP8 checkpoint: kv_b_proj's staged FP8 tensors are dequantized into the live
    float weight (zeroed here first, which changes the answers)."""
    save_fp8_deepseek("v3", tmp_path)
    prompts = prompts_without_pad(3)
    with radixlm.Engine(str(tmp_path), dtype="float32", device="cpu", random_seed=0) as engine:
        before = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
        engine.runner.model.model.layers[1].self_attn.kv_b_proj.weight.data.zero_()
        broken = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
        ok, message = engine.update_weights_from_disk(str(tmp_path))
        after = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    assert ok, message
    assert broken != before and after == before


def test_online_fp8_leaves_kv_b_proj_float(tmp_path):
    """--quantization fp8 on a float DeepSeek: the projections quantized at load, kv_b_proj left as the checkpoint
    has it (rounding it through FP8 only to dequantize it would lose precision and save nothing)."""
    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.model_loader.loader import load_model

    save_deepseek(configs()["v3"], tmp_path, seed=5)
    online = load_model(ModelConfig.from_path(str(tmp_path), dtype="float32", quantization="fp8"))
    plain = load_model(ModelConfig.from_path(str(tmp_path), dtype="float32"))
    ours, theirs = (m.model.layers[1].self_attn for m in (online, plain))
    assert ours.o_proj.weight.dtype == FP8_DTYPE and ours.kv_b_proj.quant_method is None
    assert torch.equal(ours.kv_b_proj.weight, theirs.kv_b_proj.weight)
