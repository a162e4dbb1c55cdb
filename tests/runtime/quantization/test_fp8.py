"""FP8 checkpoints (SGLang's fp8 / w8a8_fp8 formats: per-tensor, per-channel and block scales, static activation
scales) and online FP8: radixlm's greedy tokens equal transformers' on the dequantized weights (float32, CPU), dense
(Llama, Qwen2) and MoE (Mixtral, Qwen2-MoE)."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kernels.quant import FP8_DTYPE
from tests.runtime.quantization import fp8_checkpoints as fp8
from tests.runtime.quantization.helpers import (assert_greedy_matches, dense_config, load, moe_config, quantize_saved,
                                                tiny_float)

FORMATS = {
    "per-tensor": (lambda n, w: fp8.per_tensor(n, w), {"quant_method": "fp8", "activation_scheme": "dynamic"}),
    "per-tensor-static": (lambda n, w: fp8.per_tensor(n, w, static=True),
                          {"quant_method": "fp8", "activation_scheme": "static"}),
    "per-channel": (fp8.per_channel, {"quant_method": "w8a8_fp8"}),
    "block": (fp8.block(32, 16), {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                  "weight_block_size": [32, 16]}),
}


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_dense_fp8_checkpoint_matches_dequantized_reference(fmt, kind, tmp_path):
    tiny_float(tmp_path, dense_config(kind), seed=3)
    hf = quantize_saved(tmp_path, *FORMATS[fmt])
    assert_greedy_matches(tmp_path, hf)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_moe_fp8_checkpoint_matches_dequantized_reference(fmt, kind, tmp_path):
    tiny_float(tmp_path, moe_config(kind), seed=4)
    hf = quantize_saved(tmp_path, *FORMATS[fmt])
    assert_greedy_matches(tmp_path, hf)


@pytest.mark.parametrize("flag", ["fp8", "w8a8_fp8"])
@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_online_fp8_quantizes_a_float_checkpoint_per_channel(flag, kind, tmp_path):
    """--quantization fp8 on a float checkpoint: each linear and expert quantized per output channel at load (the
    reference: the same per-channel round-to-nearest, computed here)."""
    tiny_float(tmp_path, dense_config(kind) if kind == "llama" else moe_config(kind), seed=5)
    hf = quantize_saved(tmp_path, fp8.per_channel, None, write=False)
    assert_greedy_matches(tmp_path, hf, quantization=flag)
    model, _ = load(tmp_path, flag)
    down = model.model.layers[0].mlp.down_proj if kind == "llama" else model.model.layers[0].mlp.experts
    scale = down.weight_scale if kind == "llama" else down.w2_weight_scale
    assert (down.weight if kind == "llama" else down.w2_weight).dtype == FP8_DTYPE
    assert scale.shape[-1] == 64 and scale.dtype == torch.float32
