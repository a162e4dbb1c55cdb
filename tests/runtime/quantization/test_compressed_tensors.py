"""compressed-tensors checkpoints with FP8 schemes (W8A8-FP8 per tensor with static activation scales, per channel
with dynamic ones, 128x128-style blocks, FP8 weight-only), made and decompressed by the compressed-tensors library:
radixlm's greedy tokens equal transformers' on the decompressed weights (float32, CPU), dense and MoE, with ignore
lists (names and `re:` regexes) leaving layers in float; and the refusals of what radixlm cannot load."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.model_loader.files import ModelLoadError
from tests.runtime.models.conftest import run_logits
from tests.runtime.quantization.ct_checkpoints import quantize_ct, scheme
from tests.runtime.quantization.helpers import (assert_greedy_matches, assert_quantized, dense_config, load,
                                                moe_config, tiny_float)

FLOAT = "float-quantized"


def _weight_only():
    s = scheme("FP8_DYNAMIC")
    s.input_activations = None
    return s


SCHEMES = {
    "fp8-static": lambda: scheme("FP8"),
    "fp8-dynamic": lambda: scheme("FP8_DYNAMIC"),
    "fp8-block": lambda: scheme("FP8_BLOCK", block=(32, 16)),
    "fp8-weight-only": _weight_only,
}


@pytest.mark.parametrize("name", list(SCHEMES))
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_dense(name, kind, tmp_path):
    tiny_float(tmp_path / "m", dense_config(kind), seed=11)
    hf = quantize_ct(tmp_path / "m", {"group_0": SCHEMES[name]()}, FLOAT, ignore=["lm_head"])
    assert_greedy_matches(tmp_path / "m", hf)


@pytest.mark.parametrize("name", ["fp8-static", "fp8-dynamic", "fp8-block"])
@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_moe(name, kind, tmp_path):
    tiny_float(tmp_path / "m", moe_config(kind), seed=12)
    hf = quantize_ct(tmp_path / "m", {"group_0": SCHEMES[name]()}, FLOAT,
                     ignore=["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$", "re:.*shared_expert_gate$"])
    assert_greedy_matches(tmp_path / "m", hf)


def test_ignore_list_and_groups_by_regex(tmp_path):
    """Layer 1's MLP ignored by regex (float), o_proj in a per-channel group named by regex, the rest per tensor."""
    tiny_float(tmp_path / "m", dense_config(), seed=13)
    groups = {"group_0": scheme("FP8"), "group_1": scheme("FP8_DYNAMIC", targets=["re:.*o_proj$"])}
    hf = quantize_ct(tmp_path / "m", groups, FLOAT, ignore=["lm_head", r"re:.*layers\.1\.mlp\..*"])
    assert_greedy_matches_partial(tmp_path / "m", hf)


def assert_greedy_matches_partial(path, hf):
    from tests.runtime.quantization.helpers import NEW_TOKENS, VOCAB, radix_greedy
    from tests.runtime.models.tiny import hf_greedy, random_prompts

    model, cfg = load(path)
    layers = model.model.layers
    assert layers[1].mlp.gate_up_proj.quant_method is None and layers[1].mlp.down_proj.quant_method is None
    assert layers[0].mlp.down_proj.weight_scale.dim() == 0  # per tensor
    assert layers[1].self_attn.o_proj.weight_scale.shape == (64,)  # its own group: per channel
    prompts = random_prompts(3, [6, 9], VOCAB)
    for prompt, (ref, _) in zip(prompts, hf_greedy(hf, prompts, cfg.eos_token_ids, NEW_TOKENS)):
        assert radix_greedy(model, prompt, NEW_TOKENS, cfg.eos_token_ids) == ref


def test_dummy_weights(tmp_path):
    tiny_float(tmp_path / "m", moe_config("mixtral"), seed=0)
    quantize_ct(tmp_path / "m", {"group_0": scheme("FP8_BLOCK", block=(16, 16))}, FLOAT, ignore=["lm_head"])
    model, _ = load(tmp_path / "m", load_format="dummy")
    assert_quantized(model)
    assert torch.isfinite(run_logits(model, torch.arange(7))).all()


def test_flag_agrees(tmp_path):
    tiny_float(tmp_path / "m", dense_config(), seed=0)
    quantize_ct(tmp_path / "m", {"group_0": scheme("FP8_DYNAMIC")}, FLOAT)
    load(tmp_path / "m", "compressed-tensors")
    with pytest.raises(ModelLoadError, match="--quantization fp8 contradicts the checkpoint, which is quantized with "
                                             "compressed-tensors"):
        load(tmp_path / "m", "fp8")


def test_partly_ignored_fused_layer_is_refused(tmp_path):
    tiny_float(tmp_path / "m", dense_config(), seed=0)
    quantize_ct(tmp_path / "m", {"group_0": scheme("FP8_DYNAMIC")}, FLOAT, ignore=["model.layers.0.self_attn.q_proj"])
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.self_attn\.qkv_proj is loaded as one layer from "):
        load(tmp_path / "m")


@pytest.mark.parametrize("edit, message", [
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=16),
     "FP8 weight strategy 'group' is not supported"),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits=4, type="float"),
     "float4 weights in format 'float-quantized' are not supported"),
    (lambda qc: qc.update(format="nvfp4-pack-quantized"), "'nvfp4-pack-quantized' are not supported"),
    (lambda qc: qc["config_groups"]["group_0"].update(weights=None), "quantizes no weights"),
    (lambda qc: qc.update(sparsity_config={"format": "sparse-24-bitmask"}), "sparsity_config"),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(symmetric=False), "asymmetric FP8"),
])
def test_unsupported_schemes_are_refused(tmp_path, edit, message):
    import json

    tiny_float(tmp_path / "m", dense_config(), seed=0)
    quantize_ct(tmp_path / "m", {"group_0": scheme("FP8_DYNAMIC")}, FLOAT)
    cfg_path = tmp_path / "m" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    edit(cfg["quantization_config"])
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=message):
        load(tmp_path / "m")


def test_kv_cache_scheme_scales_apply_to_a_float8_pool(tmp_path, monkeypatch):
    """llm-compressor's FP8 KV output: a kv_cache_scheme in the config and per-layer self_attn.k_scale / v_scale
    tensors. The scales reach a float8 pool; `auto` keeps the model's dtype and ignores them (as vLLM does)."""
    import json

    from compressed_tensors.quantization import QuantizationArgs
    from safetensors.torch import load_file, save_file

    from radixlm.runtime.cache.kv_quant import KVScales
    from tests.runtime.models.test_kv_scales import _runner

    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    tiny_float(tmp_path / "m", dense_config(), seed=3)
    quantize_ct(tmp_path / "m", {"group_0": scheme("FP8_DYNAMIC")}, FLOAT, ignore=["lm_head"])
    cfg_path = tmp_path / "m" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    kv = QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True)
    cfg["quantization_config"]["kv_cache_scheme"] = kv.model_dump(mode="json")
    cfg_path.write_text(json.dumps(cfg))
    layers = cfg["num_hidden_layers"]
    f = tmp_path / "m" / "model.safetensors"
    tensors = load_file(f)
    for i in range(layers):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor([0.5 + i])
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([0.25 * (i + 1)])
    save_file(tensors, f, metadata={"format": "pt"})
    pool = _runner(tmp_path / "m", "fp8_e4m3").token_to_kv_pool
    assert pool.dtype == torch.float8_e4m3fn
    assert [pool.kv_scales(i) for i in range(layers)] == [KVScales(0.5 + i, 0.25 * (i + 1)) for i in range(layers)]
    auto = _runner(tmp_path / "m", "auto").token_to_kv_pool
    assert auto.dtype == torch.float32 and all(auto.kv_scales(i) == KVScales() for i in range(layers))
