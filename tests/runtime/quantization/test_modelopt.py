"""NVIDIA ModelOpt FP8 checkpoints, written from the format's description (e4m3 `weight`, per-tensor `weight_scale`
and static `input_scale` for quant_algo FP8; a per-channel `weight_scale` for FP8_PER_CHANNEL_PER_TOKEN; KV scales
on `k_proj` / `v_proj`), described by config.json's quantization_config or by ModelOpt's hf_quant_config.json:
radixlm's greedy tokens equal transformers' on the dequantized weights (float32, CPU), dense and MoE; exclusion
globs leave their modules in float; the flags SGLang spells for other engines' kernels read the same checkpoints."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlm.runtime.model_loader.files import ModelLoadError
from radixlm.runtime.quantization import quant_config_from
from radixlm.runtime.quantization.fp8 import ActivationScheme, Fp8Granularity
from radixlm.runtime.quantization.config import is_ignored
from radixlm.runtime.quantization.modelopt import ModelOptFp8Config, exclusion_patterns
from tests.runtime.models.tiny import hf_greedy, random_prompts
from tests.runtime.quantization import fp8_checkpoints as fp8
from tests.runtime.quantization.helpers import (NEW_TOKENS, VOCAB, assert_greedy_matches, dense_config, load,
                                                moe_config, quantize_saved, radix_greedy, set_quantization_config,
                                                tiny_float)
from tests.runtime.quantization.test_config import _Cfg


def per_channel_flat(name: str, w: torch.Tensor):
    parts, deq = fp8.per_channel(name, w)
    return {**parts, "weight_scale": parts["weight_scale"].reshape(-1)}, deq


ALGOS = {"FP8": lambda n, w: fp8.per_tensor(n, w, static=True), "FP8_PER_CHANNEL_PER_TOKEN": per_channel_flat}


def write_hf_quant_config(path, quantization: dict) -> None:
    (path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt", "version": "0.31.0"}, "quantization": quantization}))


@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("kind", ["llama", "mixtral"])
@pytest.mark.parametrize("where", ["config.json", "hf_quant_config.json"])
def test_modelopt_checkpoint_matches_dequantized_reference(algo, kind, where, tmp_path):
    tiny_float(tmp_path, dense_config() if kind == "llama" else moe_config(), seed=6)
    quantization = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
    if where == "config.json":
        hf = quantize_saved(tmp_path, ALGOS[algo], {"quant_method": "modelopt", **quantization})
    else:
        hf = quantize_saved(tmp_path, ALGOS[algo], None)
        write_hf_quant_config(tmp_path, quantization)
    assert_greedy_matches(tmp_path, hf)
    model, cfg = load(tmp_path)
    assert isinstance(cfg.quant_config, ModelOptFp8Config)
    static = algo == "FP8"
    assert cfg.quant_config.scheme.activation is (ActivationScheme.STATIC if static else ActivationScheme.DYNAMIC)
    o_proj = model.model.layers[1].self_attn.o_proj
    assert o_proj.weight_scale.shape == (() if static else (64,))
    assert hasattr(o_proj, "input_scale") == static


def test_exclusion_globs_leave_their_modules_in_float(tmp_path):
    tiny_float(tmp_path, dense_config(), seed=7)
    excluded = lambda name: name.startswith("model.layers.1.self_attn.")  # noqa: E731
    hf = quantize_saved(tmp_path, ALGOS["FP8"], None, skip=excluded)
    write_hf_quant_config(tmp_path, {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                                     "exclude_modules": ["lm_head", "model.layers.1.self_attn*"]})
    model, _ = load(tmp_path)
    attn = [model.model.layers[i].self_attn for i in (0, 1)]
    assert attn[0].qkv_proj.quant_method is not None and attn[0].o_proj.quant_method is not None
    assert attn[1].qkv_proj.quant_method is None and attn[1].o_proj.quant_method is None
    assert attn[1].qkv_proj.weight.dtype == torch.float32
    assert model.model.layers[1].mlp.down_proj.quant_method is not None
    prompt = random_prompts(2, [9], VOCAB)[0]
    ref = hf_greedy(hf, [prompt], frozenset(), NEW_TOKENS)[0][0]
    assert radix_greedy(model, prompt, NEW_TOKENS, frozenset()) == ref


def test_exclusion_patterns():
    ignore = exclusion_patterns(["lm_head", "model.layers.*.mlp.gate", "model.visual*", "model.layers.3"])
    assert is_ignored("lm_head", ignore)
    assert is_ignored("model.layers.7.mlp.gate", ignore) and not is_ignored("model.layers.7.mlp.gate_up_proj", ignore)
    assert is_ignored("model.visual.blocks.0.attn.qkv", ignore)
    assert is_ignored("model.layers.3.mlp.down_proj", ignore)
    assert not is_ignored("model.layers.30.mlp.down_proj", ignore)
    with pytest.raises(ValueError, match="list of module names"):
        exclusion_patterns("lm_head")


def test_kv_cache_scales_on_the_projections_reach_a_float8_pool(tmp_path, monkeypatch):
    from radixlm.runtime.cache.kv_quant import KVScales
    from tests.runtime.models.test_kv_scales import _runner

    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    tiny_float(tmp_path / "m", dense_config(), seed=3)
    quantize_saved(tmp_path / "m", ALGOS["FP8"], {"quant_method": "modelopt", "quant_algo": "FP8",
                                                 "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]})
    f = tmp_path / "m" / "model.safetensors"
    tensors = load_file(f)
    for i in range(2):
        tensors[f"model.layers.{i}.self_attn.k_proj.k_scale"] = torch.tensor(0.5 + i)
        tensors[f"model.layers.{i}.self_attn.v_proj.v_scale"] = torch.tensor(0.25 * (i + 1))
    save_file(tensors, f, metadata={"format": "pt"})
    pool = _runner(tmp_path / "m", "fp8_e4m3").token_to_kv_pool
    assert [pool.kv_scales(i) for i in range(2)] == [KVScales(0.5 + i, 0.25 * (i + 1)) for i in range(2)]


@pytest.mark.parametrize("quantization, message", [
    ({"quant_algo": "NVFP4", "group_size": 16}, "quant_algo 'NVFP4'"),
    ({"quant_algo": "FP8", "kv_cache_quant_algo": "INT8"}, "kv_cache_quant_algo 'INT8'"),
    ({"quant_algo": "FP8", "exclude_modules": "lm_head"}, "list of module names"),
])
def test_refused_at_start_up(quantization, message, tmp_path):
    tiny_float(tmp_path, dense_config(), seed=0)
    write_hf_quant_config(tmp_path, quantization)
    with pytest.raises(ModelLoadError, match=message):
        load(tmp_path)


def test_unreadable_hf_quant_config_is_refused(tmp_path):
    tiny_float(tmp_path, dense_config(), seed=0)
    (tmp_path / "hf_quant_config.json").write_text('{"producer": {"name": "modelopt"}}')
    with pytest.raises(ModelLoadError, match="cannot read hf_quant_config.json: KeyError"):
        load(tmp_path)


def test_config_json_wins_over_hf_quant_config(tmp_path):
    tiny_float(tmp_path, dense_config(), seed=0)
    set_quantization_config(tmp_path, {"quant_method": "w8a8_fp8"})
    write_hf_quant_config(tmp_path, {"quant_algo": "NVFP4"})
    assert quant_config_from(_Cfg({"quant_method": "w8a8_fp8"}), None, str(tmp_path)).scheme.granularity is \
        Fp8Granularity.CHANNEL


@pytest.mark.parametrize("ckpt, flag, ok", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "awq_marlin", True),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq_marlin", True),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "moe_wna16", True),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "moe_wna16", True),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "modelopt_fp8", True),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "modelopt", True),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "awq_marlin", False),
    ({"quant_method": "fp8"}, "modelopt_fp8", False),
])
def test_kernel_flags_read_their_formats(ckpt, flag, ok):
    if ok:
        assert quant_config_from(_Cfg(ckpt), flag) == quant_config_from(_Cfg(ckpt), None)
    else:
        with pytest.raises(ValueError, match=f"--quantization {flag} contradicts the checkpoint"):
            quant_config_from(_Cfg(ckpt), flag)


@pytest.mark.parametrize("flag, message", [
    ("awq_marlin", "--quantization awq_marlin runs awq checkpoints; this checkpoint has no quantization_config"),
    ("moe_wna16", "runs awq or gptq checkpoints"),
    ("modelopt", "reads checkpoints exported by NVIDIA ModelOpt"),
    ("modelopt_fp8", "runs modelopt checkpoints"),
])
def test_checkpoint_flags_on_a_float_checkpoint_are_refused(flag, message):
    with pytest.raises(ValueError, match=None) as e:
        quant_config_from(_Cfg(), flag)
    assert message in str(e.value)


def test_a_flag_spelling_is_not_a_checkpoint_format():
    with pytest.raises(ValueError, match="'awq_marlin' is a --quantization flag"):
        quant_config_from(_Cfg({"quant_method": "awq_marlin"}), None)
