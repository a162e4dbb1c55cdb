"""FP8 loading beyond the happy path: dummy weights in every FP8 format (the float dummy model's weights,
quantized), and the refusals at start-up, each naming the checkpoint tensor or module at fault (missing or
misshaped scales, blocks that merged projections or a tensor-parallel split cut, dtypes that contradict the config,
FP8 tensors without a quantization_config)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.kernels.quant import FP8_DTYPE, dequant_fp8
from radixlm.runtime.model_loader.files import ModelLoadError
from tests.runtime.models.conftest import run_logits
from tests.runtime.quantization import fp8_checkpoints as fp8
from tests.runtime.quantization.helpers import (assert_quantized, dense_config, load, moe_config, quantize_saved,
                                                set_quantization_config, tiny_float)

CONFIGS = {
    "per-tensor": {"quant_method": "fp8"},
    "per-tensor-static": {"quant_method": "fp8", "activation_scheme": "static"},
    "per-channel": {"quant_method": "w8a8_fp8"},
    "block": {"quant_method": "fp8", "weight_block_size": [32, 16]},
    "online": None,
}


@pytest.mark.parametrize("fmt", list(CONFIGS))
@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_dummy_weights_are_the_float_dummy_model_quantized(fmt, kind, tmp_path):
    tiny_float(tmp_path, dense_config() if kind == "llama" else moe_config(), seed=0)
    float_model, _ = load(tmp_path, load_format="dummy")
    set_quantization_config(tmp_path, CONFIGS[fmt])
    model, _ = load(tmp_path, "fp8" if fmt == "online" else None, load_format="dummy")
    assert_quantized(model)
    ids = torch.arange(9)
    assert torch.isfinite(run_logits(model, ids)).all()
    qkv, ref = model.model.layers[1].self_attn.qkv_proj, float_model.model.layers[1].self_attn.qkv_proj.weight
    assert qkv.weight.dtype == FP8_DTYPE
    w = dequant_fp8(qkv.weight, qkv.weight_scale, qkv.weight_block)
    assert ((w - ref).abs().max() / ref.abs().max()).item() < 0.07  # e4m3's rounding, not another draw
    if kind == "mixtral":
        experts, ref = model.model.layers[0].mlp.experts, float_model.model.layers[0].mlp.experts.w2_weight
        w = dequant_fp8(experts.w2_weight[3], experts.w2_weight_scale[3], experts.weight_block)
        assert ((w - ref[3]).abs().max() / ref[3].abs().max()).item() < 0.07


def _quantized(tmp_path, quantize, qc, kind="llama"):
    tiny_float(tmp_path, dense_config() if kind == "llama" else moe_config(), seed=1)
    quantize_saved(tmp_path, quantize, qc)
    return tmp_path / "model.safetensors"


def _edit(f, fn) -> None:
    tensors = load_file(f)
    fn(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


def test_missing_scale_is_refused_by_name(tmp_path):
    f = _quantized(tmp_path, fp8.per_tensor, {"quant_method": "fp8"})
    _edit(f, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight_scale"))
    with pytest.raises(ModelLoadError, match=r"missing weights.*model\.layers\.1\.self_attn\.k_proj\.weight_scale"):
        load(tmp_path)


def test_missing_expert_scale_is_refused_by_name(tmp_path):
    f = _quantized(tmp_path, fp8.per_channel, {"quant_method": "w8a8_fp8"}, kind="mixtral")
    _edit(f, lambda t: t.pop("model.layers.0.block_sparse_moe.experts.2.w3.weight_scale"))
    with pytest.raises(ModelLoadError, match=r"missing weights.*layers\.0\.mlp\.experts\.w13_weight_scale\[shard "
                                             r"\(2, 'up'\)\]"):
        load(tmp_path)


@pytest.mark.parametrize("name, value, message", [
    ("model.layers.0.mlp.down_proj.weight_scale", torch.ones(65, 1),
     r"model\.layers\.0\.mlp\.down_proj\.weight_scale: tensor weight_scale has shape \(65, 1\), expected \(64,\)"),
    ("model.layers.0.mlp.up_proj.weight_scale", torch.ones(96, 1, dtype=torch.int32),
     r"model\.layers\.0\.mlp\.up_proj\.weight_scale: tensor weight_scale is stored as torch\.int32"),
    ("model.layers.1.self_attn.o_proj.weight", torch.ones(64, 64),
     r"model\.layers\.1\.self_attn\.o_proj\.weight: tensor weight is stored as torch\.float32, expected "
     r"torch\.float8_e4m3fn"),
])
def test_misshaped_or_mistyped_tensors_are_refused_by_name(tmp_path, name, value, message):
    f = _quantized(tmp_path, fp8.per_channel, {"quant_method": "w8a8_fp8"})
    _edit(f, lambda t: t.__setitem__(name, value))
    with pytest.raises(ModelLoadError, match=message):
        load(tmp_path)


def test_per_channel_scales_under_a_per_tensor_config_are_refused(tmp_path):
    _quantized(tmp_path, fp8.per_channel, {"quant_method": "fp8"})
    with pytest.raises(ModelLoadError, match=r"layers\.0\.mlp\.down_proj\.weight_scale: tensor weight_scale has shape "
                                             r"\(64, 1\), expected a single value"):
        load(tmp_path)


def test_fp8_tensors_without_a_quantization_config_are_refused(tmp_path):
    _quantized(tmp_path, fp8.per_tensor, None)
    with pytest.raises(ModelLoadError, match=r"down_proj\.weight: .* is stored as torch\.float8_e4m3fn \(quantized\) "
                                             r"but its layer is not quantized"):
        load(tmp_path)


def test_blocks_must_not_cut_merged_projections(tmp_path):
    _quantized(tmp_path, fp8.block(48, 16), {"quant_method": "fp8", "weight_block_size": [48, 16]})
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.self_attn\.qkv_proj: .*merged projections' rows "
                                             r"\(\[64, 32, 32\] on this rank\) do not fall on its 48-row blocks"):
        load(tmp_path)


def test_blocks_must_not_be_cut_by_tensor_parallelism(tmp_path):
    _quantized(tmp_path, fp8.block(16, 32), {"quant_method": "fp8", "weight_block_size": [16, 32]})
    load(tmp_path)  # one rank: fine
    with pytest.raises(ModelLoadError, match=r"layers\.0\.mlp\.down_proj: .*this rank's input channels 48\.\.96 of 96 "
                                             r"do not fall on the 32-channel boundaries"):
        load(tmp_path, parallel=Parallel(tp_rank=1, tp_size=2))


def test_a_quantized_lm_head_is_refused(tmp_path):
    """Embeddings and the LM head stay float: an FP8 lm_head in the checkpoint must not be cast without its scale."""
    tiny_float(tmp_path, dense_config(), seed=2)
    quantize_saved(tmp_path, fp8.per_channel, {"quant_method": "w8a8_fp8"})
    f = tmp_path / "model.safetensors"
    _edit(f, lambda t: t.update({"lm_head.weight": t["lm_head.weight"].to(FP8_DTYPE),
                                 "lm_head.weight_scale": torch.ones(97, 1)}))
    with pytest.raises(ModelLoadError, match=r"lm_head\.weight: weight weight is stored as torch\.float8_e4m3fn"):
        load(tmp_path)
