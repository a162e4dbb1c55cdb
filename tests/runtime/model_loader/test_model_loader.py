"""Model loading: config resolution, dummy weights, and the errors a user can hit."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from radixlm.runtime.model_loader.config import ModelConfig, resolve_dtype
from radixlm.runtime.model_loader.files import resolve_model_path
from radixlm.runtime.model_loader.loader import ModelLoadError, load_model

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))


def _save_tiny(path, config_cls=LlamaConfig, **overrides):
    config = config_cls(**{**TINY, **overrides})
    config.architectures = [config_cls.__name__.replace("Config", "ForCausalLM")]
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config)
    hf.save_pretrained(path, safe_serialization=True)
    return config


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "no" / "such-model"
    with pytest.raises(ModelLoadError, match="no/such-model"):
        ModelConfig.from_path(str(missing))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        ModelConfig.from_path(str(tmp_path))


def test_unknown_architecture_is_named(tmp_path):
    _save_tiny(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["architectures"] = ["FancyNetForCausalLM"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="FancyNetForCausalLM") as e:
        ModelConfig.from_path(str(tmp_path / "m"))
    assert "LlamaForCausalLM" in str(e.value)  # the message lists what is supported


def test_truncated_safetensors_names_file(tmp_path):
    _save_tiny(tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    mc = ModelConfig.from_path(str(tmp_path / "m"))
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_model(mc)


def test_missing_and_misshaped_weights(tmp_path):
    _save_tiny(tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    tensors = load_file(f)
    good = dict(tensors)
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    mc = ModelConfig.from_path(str(tmp_path / "m"))
    with pytest.raises(ModelLoadError, match=r"missing.*layers\.1\.self_attn\.k_proj\.weight"):
        load_model(mc)
    good["model.norm.weight"] = torch.ones(7)
    save_file(good, f, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight.*\(7,\)"):
        load_model(mc)


def test_sharded_safetensors_load(tmp_path):
    _save_tiny(tmp_path / "m", Qwen2Config, tie_word_embeddings=False)
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    (tmp_path / "m" / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[::2]}, tmp_path / "m" / "model-00001-of-00002.safetensors")
    save_file({k: tensors[k] for k in names[1::2]}, tmp_path / "m" / "model-00002-of-00002.safetensors")
    model = load_model(ModelConfig.from_path(str(tmp_path / "m")))
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])
    qkv_bias = model.model.layers[0].self_attn.qkv_proj.bias
    assert torch.equal(qkv_bias[:32], tensors["model.layers.0.self_attn.q_proj.bias"])


def test_dummy_load_shapes_and_determinism(tmp_path):
    _save_tiny(tmp_path / "m", tie_word_embeddings=False)
    (tmp_path / "m" / "model.safetensors").unlink()
    mc = ModelConfig.from_path(str(tmp_path / "m"), load_format="dummy")
    a = load_model(mc, load_format="dummy")
    b = load_model(mc, load_format="dummy")
    assert a.lm_head.weight.shape == (97, 32)
    assert a.model.layers[1].self_attn.qkv_proj.weight.shape == (32 + 2 * 16, 32)
    assert a.model.layers[0].mlp.gate_up_proj.weight.shape == (96, 32)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.isfinite(p).all() and torch.equal(p, q), n
    assert 0.015 < a.model.embed_tokens.weight.std().item() < 0.025


def test_model_config_fields(tmp_path):
    _save_tiny(tmp_path / "m", Qwen2Config, eos_token_id=5)
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    mc = ModelConfig.from_path(str(tmp_path / "m"), context_length=128)
    assert (mc.architecture, mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.head_dim) == (
        "Qwen2ForCausalLM", 2, 4, 2, 8)
    assert (mc.hidden_size, mc.vocab_size, mc.context_len) == (32, 97, 128)
    assert mc.eos_token_ids == frozenset({5, 6})
    assert mc.dtype == torch.float32
    with pytest.raises(ValueError, match="exceeds"):
        ModelConfig.from_path(str(tmp_path / "m"), context_length=100000)


def test_resolve_dtype():
    bf16_cfg = Qwen2Config(dtype="bfloat16")
    assert resolve_dtype("auto", bf16_cfg, "cpu") == torch.float32
    assert resolve_dtype("auto", bf16_cfg, "cuda") == torch.bfloat16
    assert resolve_dtype("auto", Qwen2Config(dtype="float16"), "cuda:0") == torch.float16
    assert resolve_dtype("auto", Qwen2Config(), "cuda") == torch.bfloat16
    assert resolve_dtype("float16", bf16_cfg, "cpu") == torch.float16
    with pytest.raises(ValueError, match="int4"):
        resolve_dtype("int4", bf16_cfg, "cpu")


def test_truncated_gguf_names_file(tmp_path):
    src = resolve_model_path("default")
    bad = tmp_path / "broken.gguf"
    with open(src, "rb") as f:
        bad.write_bytes(f.read(40 << 20))  # metadata intact, tensor data cut short
    with pytest.raises(ModelLoadError, match="broken.gguf is truncated or corrupt"):
        ModelConfig.from_path(str(bad))
    assert not list((tmp_path / "cache" / "converted").glob("*"))  # no half-written cache entry


def test_gguf_header_garbage(tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(ModelLoadError, match="garbage.gguf"):
        ModelConfig.from_path(str(bad))
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(ModelLoadError, match="neither a GGUF file nor a model directory"):
        ModelConfig.from_path(str(other))


def test_gguf_config_and_tokenizer_reuse_the_parsed_reader(tmp_path, monkeypatch):
    """transformers builds the config and the tokenizer from the reader the conversion parsed (a parse walks the
    vocabulary: 12.6 s for Qwen2.5-0.5B on 2 cores), and gguf.GGUFReader is itself again afterwards."""
    import gguf

    from radixlm.runtime.model_loader import gguf as gguf_mod

    path = resolve_model_path("default")
    reader = gguf.GGUFReader(path)
    original = gguf.GGUFReader

    def parsed_again(*args, **kwargs):
        raise AssertionError(f"the GGUF file was parsed again: {args}")

    monkeypatch.setattr(gguf, "GGUFReader", parsed_again)
    gguf_mod._write_config_and_tokenizer(reader, path, tmp_path)
    assert gguf.GGUFReader is parsed_again
    monkeypatch.setattr(gguf, "GGUFReader", original)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and (tmp_path / "tokenizer.json").is_file()
    with gguf_mod._parsed_once(reader, path):
        assert gguf.GGUFReader(path) is reader
    assert gguf.GGUFReader is original


def test_gguf_config_and_tokenizer_alone_skip_the_weights(tmp_path, monkeypatch):
    """resolve_model_dir(with_tensors=False) writes a GGUF's config and tokenizer without dequantizing its weights,
    in a directory of their own; once the whole conversion is cached, it is the answer to both."""
    from radixlm.runtime.model_loader import gguf as gguf_mod
    from radixlm.runtime.model_loader.config import resolve_model_dir

    def no_weights(*args):
        raise AssertionError("the weights were dequantized")

    monkeypatch.setattr(gguf_mod, "_write_tensors", no_weights)
    light = resolve_model_dir("default", with_tensors=False)
    files = {f.name for f in (tmp_path / "cache" / "converted").glob("*/*")}
    assert light.endswith("-config") and {"config.json", "tokenizer.json"} <= files
    assert not any(f.endswith(".safetensors") for f in files)
    assert resolve_model_dir("default", with_tensors=False) == light  # cached

    monkeypatch.setattr(gguf_mod, "_write_tensors", lambda reader, path, out: (out / "model.safetensors").touch())
    full = resolve_model_dir("default")
    assert full != light and (tmp_path / "cache" / "converted" / full.rsplit("/", 1)[1] / "model.safetensors").is_file()
    assert resolve_model_dir("default", with_tensors=False) == full


def test_gguf_tensor_writer_shards(tmp_path, monkeypatch):
    from radixlm.runtime.model_loader import gguf as gguf_mod
    from radixlm.runtime.model_loader.loader import safetensors_files, safetensors_weights_iterator

    tensors = {f"t{i}": torch.full((10, 10), float(i)) for i in range(5)}  # 400 bytes each
    monkeypatch.setattr(gguf_mod, "iter_gguf_tensors", lambda reader: iter(tensors.items()))
    monkeypatch.setattr(gguf_mod, "MAX_SHARD_BYTES", 900)

    fake_reader = type("FakeReader", (), {"tensors": list(tensors)})()
    gguf_mod._write_tensors(fake_reader, "x.gguf", tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    got = {name: w[...] for name, w in safetensors_weights_iterator(safetensors_files(str(tmp_path)))}
    assert got.keys() == tensors.keys() and all(torch.equal(got[k], v) for k, v in tensors.items())


def test_unpermute_inverts_llama_cpp_permute():
    import numpy as np

    from radixlm.runtime.model_loader.gguf import unpermute_qk

    n_head, head_dim, cols = 3, 8, 5
    w = np.arange(n_head * head_dim * cols, dtype=np.float32).reshape(n_head * head_dim, cols)
    # llama.cpp's converter: per head, rows [0..half) and [half..dim) are interleaved pairwise.
    permuted = w.reshape(n_head, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(w.shape)
    assert np.array_equal(unpermute_qk(permuted, n_head), w)
    bias = np.arange(n_head * head_dim, dtype=np.float32)
    assert np.array_equal(unpermute_qk(bias.reshape(n_head, 2, -1).swapaxes(1, 2).reshape(-1), n_head), bias)
