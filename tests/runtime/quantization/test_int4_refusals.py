"""A bad or inconsistent INT4 checkpoint is refused at start-up (ModelConfig or load_model), naming the tensor or the
config key: missing qzeros / scales, a wrong group size, bits other than 4, inconsistent shapes or dtypes, act-order
orders that differ between merged projections, unsupported AWQ / GPTQ variants. Dummy weights load in every format."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.files import ModelLoadError
from radixlm.runtime.model_loader.loader import load_model
from tests.runtime.quantization.int4_checkpoints import Int4Spec
from tests.runtime.quantization.test_int4_models import make_int4

ATTN = "model.layers.0.self_attn"
MLP = "model.layers.1.mlp"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    specs = {"awq": Int4Spec("awq", 32), "gptq": Int4Spec("gptq", 32, act_order=True, sym=False),
             "compressed-tensors": Int4Spec("compressed-tensors", 32, sym=False)}
    return {k: make_int4(tmp_path_factory.mktemp(k), "llama", s)[0] for k, s in specs.items()}


def _edit(path, tensors=None, config=None):
    """Rewrites the checkpoint in place: tensors(dict) and config(dict) mutate them."""
    if tensors is not None:
        t = load_file(str(path / "model.safetensors"))
        tensors(t)
        save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        c = json.loads((path / "config.json").read_text())
        config(c["quantization_config"])
        (path / "config.json").write_text(json.dumps(c))


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _load(path):
    return load_model(ModelConfig.from_path(str(path), dtype="float32"))


def _refused(path, *fragments):
    with pytest.raises(ModelLoadError) as e:
        _load(path)
    for f in fragments:
        assert f in str(e.value), str(e.value)


@pytest.mark.parametrize("fmt, drop, named", [
    ("awq", f"{ATTN}.k_proj.qzeros", f"{ATTN}.k_proj.qzeros"),
    ("awq", f"{MLP}.down_proj.scales", f"{MLP}.down_proj.scales"),
    ("gptq", f"{ATTN}.o_proj.qzeros", f"{ATTN}.o_proj.qzeros"),
    ("gptq", f"{MLP}.up_proj.g_idx", f"{MLP}.up_proj.g_idx"),  # act-order: g_idx required
    ("compressed-tensors", f"{MLP}.gate_proj.weight_scale", f"{MLP}.gate_proj.weight_scale"),
    ("compressed-tensors", f"{ATTN}.v_proj.weight_zero_point", f"{ATTN}.v_proj.weight_zero_point"),
])
def test_missing_tensor_is_named(fmt, drop, named, dirs, tmp_path):
    path = _copy(dirs[fmt], tmp_path / "ckpt")
    _edit(path, tensors=lambda t: t.pop(drop))
    _refused(path, "missing", named)


@pytest.mark.parametrize("fmt, key", [("awq", "group_size"), ("gptq", "group_size"), ("compressed-tensors", None)])
def test_wrong_group_size_is_refused(fmt, key, dirs, tmp_path):
    path = _copy(dirs[fmt], tmp_path / "ckpt")

    def regroup(qc):
        if key is None:
            qc["config_groups"]["group_0"]["weights"]["group_size"] = 16
        else:
            qc[key] = 16

    _edit(path, config=regroup)
    _refused(path, "tensor model.layers.", "has shape")


@pytest.mark.parametrize("fmt", ["awq", "gptq", "compressed-tensors"])
def test_bits_other_than_4_are_refused(fmt, dirs, tmp_path):
    path = _copy(dirs[fmt], tmp_path / "ckpt")

    def eight(qc):
        if fmt == "compressed-tensors":
            qc["config_groups"]["group_0"]["weights"]["num_bits"] = 8
        else:
            qc["bits"] = 8

    _edit(path, config=eight)
    with pytest.raises(ModelLoadError, match="int8 weights" if fmt == "compressed-tensors" else "8-bit"):
        ModelConfig.from_path(str(path), dtype="float32")


@pytest.mark.parametrize("change, fragments", [
    (lambda qc: qc.update(version="gemv"), ("version", "gemv")),
    (lambda qc: qc.update(zero_point=False), ("zero_point",)),
])
def test_unsupported_awq_variants(change, fragments, dirs, tmp_path):
    path = _copy(dirs["awq"], tmp_path / "ckpt")
    _edit(path, config=change)
    with pytest.raises(ModelLoadError) as e:
        ModelConfig.from_path(str(path), dtype="float32")
    assert all(f in str(e.value) for f in fragments)


@pytest.mark.parametrize("change, fragment", [
    (lambda qc: qc.update(checkpoint_format="marlin"), "checkpoint_format"),
    (lambda qc: qc.update(dynamic={"-:.*down_proj": {}}), "dynamic"),
    (lambda qc: qc.update(lm_head=True), "lm_head"),
])
def test_unsupported_gptq_variants(change, fragment, dirs, tmp_path):
    path = _copy(dirs["gptq"], tmp_path / "ckpt")
    _edit(path, config=change)
    with pytest.raises(ModelLoadError, match=fragment):
        ModelConfig.from_path(str(path), dtype="float32")


def test_inconsistent_tensors_are_named(dirs, tmp_path):
    path = _copy(dirs["gptq"], tmp_path / "shape")
    _edit(path, tensors=lambda t: t.update({f"{ATTN}.q_proj.scales": t[f"{ATTN}.q_proj.scales"][:, :-8].contiguous()}))
    _refused(path, f"{ATTN}.q_proj.scales", "shape")

    path = _copy(dirs["gptq"], tmp_path / "dtype")
    _edit(path, tensors=lambda t: t.update({f"{MLP}.down_proj.qweight": t[f"{MLP}.down_proj.qweight"].float()}))
    _refused(path, f"{MLP}.down_proj.qweight", "torch.float32")

    path = _copy(dirs["gptq"], tmp_path / "order")  # q and k quantized in different channel orders
    _edit(path, tensors=lambda t: t.update({f"{ATTN}.k_proj.g_idx": t[f"{ATTN}.k_proj.g_idx"].flip(0)}))
    _refused(path, f"{ATTN}.qkv_proj", "g_idx differ")

    path = _copy(dirs["gptq"], tmp_path / "groups")
    _edit(path, tensors=lambda t: t.update({f"{ATTN}.o_proj.g_idx": t[f"{ATTN}.o_proj.g_idx"] + 5}))
    _refused(path, f"{ATTN}.o_proj", "groups")

    path = _copy(dirs["gptq"], tmp_path / "float_g_idx")
    _edit(path, tensors=lambda t: t.update({f"{ATTN}.o_proj.g_idx": t[f"{ATTN}.o_proj.g_idx"].float()}))
    _refused(path, f"{ATTN}.o_proj.g_idx", "expected integers")

    path = _copy(dirs["compressed-tensors"], tmp_path / "weight_shape")
    _edit(path, tensors=lambda t: t.update({f"{ATTN}.k_proj.weight_shape": torch.tensor([16, 64])}))
    _refused(path, f"{ATTN}.k_proj.weight_shape", "[16, 64]")


@pytest.mark.parametrize("fmt", ["awq", "gptq", "compressed-tensors"])
def test_dummy_load_in_each_format(fmt, dirs):
    from tests.runtime.models.conftest import run_logits

    model = load_model(ModelConfig.from_path(str(dirs[fmt]), dtype="float32"), load_format="dummy")
    proj = model.model.layers[0].self_attn.qkv_proj
    assert proj.quant_method is not None and proj.qweight.dtype == torch.int32
    logits = run_logits(model, torch.arange(7))
    assert torch.isfinite(logits).all() and logits.std() > 0


@pytest.mark.parametrize("spec, config, named", [
    # k_proj's 8 outputs split 4 | 4: AWQ packs 8 output channels to an int32
    (Int4Spec("awq", 16), dict(hidden_size=32, num_attention_heads=8, num_key_value_heads=2, intermediate_size=64),
     ("model.layers.0.self_attn.qkv_proj", "qweight", "8-row")),
    # down_proj's 40 inputs split 20 | 20: compressed-tensors packs 8 input channels to an int32
    (Int4Spec("compressed-tensors", 4, sym=True),
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=40),
     ("model.layers.0.mlp.down_proj", "weight_packed", "input channels 20..40")),
])
def test_unsliceable_tensor_parallel_layouts_are_refused(spec, config, named, tmp_path):
    from transformers import LlamaConfig

    from radixlm.runtime.distributed.parallel import Parallel
    from tests.runtime.models.tiny import save_tiny
    from tests.runtime.quantization.int4_checkpoints import quantize_checkpoint
    from tests.runtime.quantization.test_int4_models import COMMON

    save_tiny(LlamaConfig(**{**COMMON, **config}), tmp_path / "float")
    quantize_checkpoint(tmp_path / "float", tmp_path / "int4", tmp_path / "ref", spec)
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelConfig.from_path(str(tmp_path / "int4"), dtype="float32"), parallel=Parallel(1, 2))
    assert all(f in str(e.value) for f in named), str(e.value)


def test_flag_contradicting_the_checkpoint_is_refused(dirs):
    with pytest.raises(ModelLoadError, match="--quantization awq contradicts the checkpoint, which is quantized with gptq"):
        ModelConfig.from_path(str(dirs["gptq"]), dtype="float32", quantization="awq")
