"""A checkpoint's FP8 KV-cache scales (models/kv_scales.py): every spelling vLLM and SGLang load lands on its layer's
RadixAttention, the model runner hands them to a float8 pool (an auto pool ignores them), and a bad scale is refused
with the tensor's name."""
from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig

from radixlm.runtime.cache.kv_quant import KVScales
from radixlm.runtime.models.kv_scales import kv_scale_target

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)


@pytest.mark.parametrize("name, target", [
    ("model.layers.0.self_attn.k_scale", ("model.layers.0.self_attn", ("k_scale",))),
    ("model.layers.12.self_attn.v_scale", ("model.layers.12.self_attn", ("v_scale",))),
    ("model.layers.1.self_attn.kv_scale", ("model.layers.1.self_attn", ("k_scale", "v_scale"))),
    ("model.layers.1.self_attn.k_proj.k_scale", ("model.layers.1.self_attn", ("k_scale",))),
    ("model.layers.1.self_attn.qkv_proj.v_scale", ("model.layers.1.self_attn", ("v_scale",))),
    ("model.layers.1.self_attn.attn.k_scale", ("model.layers.1.self_attn", ("k_scale",))),
    ("model.layers.1.self_attn.k_proj.weight_scale", None),
    ("model.layers.1.self_attn.k_proj.input_scale", None),
    ("model.layers.1.mlp.down_proj.weight", None),
])
def test_names(name, target):
    assert kv_scale_target(name) == target


def _checkpoint(path, extra: dict[str, torch.Tensor]) -> None:
    config = LlamaConfig(**TINY)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    f = path / "model.safetensors"
    tensors = load_file(f)
    tensors.update(extra)
    save_file(tensors, f, metadata={"format": "pt"})


def _runner(path, kv_cache_dtype: str):
    from radixlm.runtime.args import ServerArgs
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.model_loader.config import ModelConfig

    args = ServerArgs(model_path=str(path), dtype="float32", device="cpu", max_total_tokens=64,
                      kv_cache_dtype=kv_cache_dtype)
    return ModelRunner(args, ModelConfig.from_path(str(path), dtype="float32", device="cpu"), "cpu")


def test_checkpoint_scales_reach_a_float8_pool(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    _checkpoint(tmp_path / "m", {"model.layers.0.self_attn.k_scale": torch.tensor(0.5),
                                 "model.layers.0.self_attn.v_scale": torch.tensor([2.0]),
                                 "model.layers.2.self_attn.kv_scale": torch.tensor(0.25, dtype=torch.bfloat16)})
    fp8 = _runner(tmp_path / "m", "fp8_e4m3")
    pool = fp8.token_to_kv_pool
    assert [pool.kv_scales(i) for i in range(3)] == [KVScales(0.5, 2.0), KVScales(), KVScales(0.25, 0.25)]
    auto = _runner(tmp_path / "m", "auto")
    assert all(auto.token_to_kv_pool.kv_scales(i) == KVScales() for i in range(3))
    assert auto.model.model.layers[0].self_attn.attn.k_scale == 0.5  # loaded, unused by a model-dtype pool


@pytest.mark.parametrize("name, value, error", [
    ("model.layers.1.self_attn.v_scale", torch.tensor(0.0), "finite and > 0"),
    ("model.layers.1.self_attn.k_scale", torch.tensor(float("nan")), "finite and > 0"),
    ("model.layers.1.self_attn.k_scale", torch.ones(2), "per-tensor"),
    ("model.layers.7.self_attn.k_scale", torch.tensor(1.0), "does not have"),
])
def test_bad_scales_are_refused_with_the_tensor_name(tmp_path, monkeypatch, name, value, error):
    from radixlm.runtime.model_loader.loader import ModelLoadError, load_model
    from radixlm.runtime.model_loader.config import ModelConfig

    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    _checkpoint(tmp_path / "m", {name: value})
    with pytest.raises(ModelLoadError, match=re.escape(name) + ".*" + error):
        load_model(ModelConfig.from_path(str(tmp_path / "m"), dtype="float32", device="cpu"))
