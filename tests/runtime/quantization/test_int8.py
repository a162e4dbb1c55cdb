"""W8A8-INT8: compressed-tensors `int-quantized` checkpoints (the library's W8A8 preset: per-channel int8 weights,
dynamic per-token int8 activations; made and decompressed by the library) and SGLang's `w8a8_int8` format (written
here from its specification): radixlm's greedy tokens equal transformers' on the dequantized weights (float32),
dense and MoE; dummy weights."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kernels.quant import dequant_int8
from tests.runtime.models.conftest import run_logits
from tests.runtime.quantization.ct_checkpoints import quantize_ct, scheme
from tests.runtime.quantization.helpers import (assert_greedy_matches, assert_quantized, dense_config, load,
                                                moe_config, quantize_saved, set_quantization_config, tiny_float)

MOE_IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$", "re:.*shared_expert_gate$"]


def _config(kind):
    return dense_config(kind) if kind in ("llama", "qwen2") else moe_config(kind)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mixtral", "qwen2_moe"])
def test_compressed_tensors_w8a8_int8(kind, tmp_path):
    tiny_float(tmp_path / "m", _config(kind), seed=31)
    hf = quantize_ct(tmp_path / "m", {"group_0": scheme("W8A8")}, "int-quantized", ignore=MOE_IGNORE)
    assert_greedy_matches(tmp_path / "m", hf)


def _sglang_int8(name: str, w: torch.Tensor):
    scale = w.abs().amax(dim=1, keepdim=True) / 127.0
    q = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
    return {"weight": q, "weight_scale": scale}, q.float() * scale


@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_sglang_w8a8_int8(kind, tmp_path):
    tiny_float(tmp_path, _config(kind), seed=32)
    hf = quantize_saved(tmp_path, _sglang_int8, {"quant_method": "w8a8_int8"})
    assert_greedy_matches(tmp_path, hf)


def test_dummy_weights_and_flag(tmp_path):
    tiny_float(tmp_path, moe_config("mixtral"), seed=0)
    float_model, _ = load(tmp_path, load_format="dummy")
    set_quantization_config(tmp_path, {"quant_method": "w8a8_int8"})
    model, _ = load(tmp_path, "w8a8_int8", load_format="dummy")
    assert_quantized(model)
    assert torch.isfinite(run_logits(model, torch.arange(7))).all()
    qkv, ref = model.model.layers[0].self_attn.qkv_proj, float_model.model.layers[0].self_attn.qkv_proj.weight
    assert qkv.weight.dtype == torch.int8
    w = dequant_int8(qkv.weight, qkv.weight_scale)
    assert ((w - ref).abs().max() / ref.abs().max()).item() < 0.01
