"""WeightUpdater without a scheduler: an FP8-quantized model (--quantization fp8, its layers converted at load) updated
from another checkpoint holds exactly what loading that checkpoint gives; a quantized layer is updated whole or not
at all; a checkpoint that lacks a tensor is refused before anything is written. And the pure parts: memory tags,
group specs, dtype names."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.distributed.weight_sync import GroupSpec, parse_dtype
from radixlm.runtime.executor.memory_saver import MemoryTag, parse_tags
from radixlm.runtime.executor.weight_update import WeightUpdateError, WeightUpdater
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import load_model
from tests.runtime.scheduler.conftest import TINY_LLAMA


def llama_tensors(seed: int) -> dict[str, torch.Tensor]:
    """A random checkpoint of TINY_LLAMA in Hugging Face's names."""
    c, g = TINY_LLAMA, torch.Generator().manual_seed(seed)
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                   p + "mlp.down_proj.weight": (h, i)}
    return {n: torch.randn(s, generator=g) * (0.1 if len(s) > 1 else 1) for n, s in shapes.items()}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fp8-update")
    for name, seed in (("A", 0), ("B", 1)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(TINY_LLAMA))
        save_file(llama_tensors(seed), root / name / "model.safetensors")
    return {n: str(root / n) for n in ("A", "B")}


def _load(path: str, quantization: str | None = "fp8"):
    cfg = ModelConfig.from_path(path, dtype="float32", device="cpu", quantization=quantization)
    return cfg, load_model(cfg, "auto", "cpu")


def test_a_quantized_model_updated_from_disk_holds_what_loading_gives(dirs):
    cfg, model = _load(dirs["A"])
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    args = ServerArgs(model_path=dirs["A"], quantization="fp8", device="cpu")
    WeightUpdater(model, cfg, SINGLE, "cpu").from_disk(dirs["B"], None, args)
    _, fresh = _load(dirs["B"])
    expected = dict(fresh.named_parameters())
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    for name, p in model.named_parameters():
        assert torch.equal(p.float(), expected[name].float()), name
        assert p.data_ptr() == before[name], name  # in place: graphs captured over them stay valid


def test_a_quantized_layer_is_updated_whole_or_not_at_all(dirs):
    cfg, model = _load(dirs["A"])
    loads = []  # before_load: once an update has passed its checks, before its first write
    updater = WeightUpdater(model, cfg, SINGLE, "cpu", before_load=lambda: loads.append(1))
    b = load_file(os.path.join(dirs["B"], "model.safetensors"))
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight.clone()
    with pytest.raises(WeightUpdateError, match="all of its tensors or none"):
        updater.from_tensors([("model.layers.0.mlp.up_proj.weight", b["model.layers.0.mlp.up_proj.weight"])], None)
    assert torch.equal(model.model.layers[0].mlp.gate_up_proj.weight, gate_up) and not loads
    updater.from_tensors([(n, b[n]) for n in ("model.layers.0.mlp.up_proj.weight",
                                              "model.layers.0.mlp.gate_proj.weight")], None)
    assert not torch.equal(model.model.layers[0].mlp.gate_up_proj.weight, gate_up) and loads == [1]


def test_a_checkpoint_missing_a_tensor_is_refused_before_any_write(dirs, tmp_path):
    cfg, model = _load(dirs["A"], quantization=None)
    b = load_file(os.path.join(dirs["B"], "model.safetensors"))
    del b["model.layers.1.post_attention_layernorm.weight"]
    (tmp_path / "config.json").write_text(open(os.path.join(dirs["B"], "config.json")).read())
    save_file(b, tmp_path / "model.safetensors")
    head = model.lm_head.weight.clone()
    with pytest.raises(WeightUpdateError, match="missing weights.*post_attention_layernorm"):
        WeightUpdater(model, cfg, SINGLE, "cpu").from_disk(str(tmp_path), None,
                                                                   ServerArgs(model_path=dirs["A"], device="cpu"))
    assert torch.equal(model.lm_head.weight, head)


def test_memory_tags():
    assert parse_tags(None) == frozenset(MemoryTag)
    assert parse_tags(["weights"]) == {MemoryTag.WEIGHTS}
    for bad, message in (([], "must not be empty"), (["kv"], "unknown memory tag"), ("weights", "list of strings")):
        with pytest.raises(ValueError, match=message):
            parse_tags(bad)


def test_the_memory_saver_flag_refuses_a_draft_model():
    with pytest.raises(ValueError, match="--enable-memory-saver"):
        ServerArgs(enable_memory_saver=True, speculative_algorithm="STANDALONE", speculative_draft_model_path="d")
    assert ServerArgs(enable_memory_saver=True, speculative_algorithm="NGRAM").enable_memory_saver


def test_group_specs_and_dtypes():
    GroupSpec("127.0.0.1", 29500, 1, 2, backend="gloo")
    for kwargs, message in ((dict(master_port=0), "master_port"), (dict(world_size=1), "world_size"),
                            (dict(rank=2), "outside"), (dict(backend="mpi"), "unknown backend"),
                            (dict(master_address=""), "master_address"), (dict(group_name=""), "group_name")):
        spec = dict(master_address="127.0.0.1", master_port=29500, rank=1, world_size=2, backend="gloo") | kwargs
        with pytest.raises(ValueError, match=message):
            GroupSpec(**spec)
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype("torch.float32") is torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("Tensor")
