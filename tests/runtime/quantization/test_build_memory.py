"""Building a quantized model never holds the whole float model: each quantizable layer's float weight leaves the
device as it is registered (deferred_float_weights), so a checkpoint that fits only quantized loads. Measured as the
peak of the bytes the CPU allocator holds during build_model (torch.profiler's memory events)."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, MixtralConfig

from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import build_model
from radixlm.runtime.quantization import deferred_float_weights
from radixlm.runtime.quantization.modules import QUANTIZABLE, float_weight_names
from tests.runtime.quantization.helpers import VOCAB, tiny_float

COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=3, max_position_embeddings=64, tie_word_embeddings=False)
CONFIGS = {"llama": lambda: LlamaConfig(**COMMON),
           "mixtral": lambda: MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)}


def _peak_bytes(fn) -> tuple[object, int]:
    """fn()'s result and the peak of the CPU bytes allocated (net of frees) while it ran."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return out, peak


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_build_holds_one_float_weight_at_a_time(kind, tmp_path):
    tiny_float(tmp_path, CONFIGS[kind](), seed=0)
    cfg = ModelConfig.from_path(str(tmp_path), dtype="float32", quantization="fp8")
    float_model = build_model(ModelConfig.from_path(str(tmp_path), dtype="float32"), "meta")
    float_weights = [getattr(m, n) for m in float_model.modules() if isinstance(m, QUANTIZABLE)
                     for n in float_weight_names(m)]
    deferred = _bytes(float_weights)
    largest = max(_bytes([w]) for w in float_weights)

    model, peak = _peak_bytes(lambda: build_model(cfg, "cpu"))

    held = _bytes(model.parameters())
    assert all(not p.is_meta for p in model.parameters())
    assert all(m.quant_method is not None for m in model.modules() if isinstance(m, QUANTIZABLE))
    assert held < deferred / 2  # FP8 holds a quarter of float32's bytes (and the float rest is small here)
    # The model as built, plus one float weight in flight (and the allocator's small change): never the float model.
    assert peak <= held + largest + (256 << 10), (peak, held, largest, deferred)


def test_layers_left_in_float_get_their_weights_on_the_device(tmp_path):
    tiny_float(tmp_path, CONFIGS["llama"](), seed=0)
    cfg = ModelConfig.from_path(str(tmp_path), dtype="float32", quantization="fp8")
    cfg = replace(cfg, quant_config=replace(cfg.quant_config, ignore=(r"re:.*layers\.1\.mlp\..*",)))
    model = build_model(cfg, "cpu")
    mlp = model.model.layers[1].mlp
    for layer in (mlp.gate_up_proj, mlp.down_proj):
        assert layer.quant_method is None
        assert layer.weight.device.type == "cpu" and layer.weight.dtype == torch.float32
    assert model.model.layers[0].mlp.down_proj.quant_method is not None


def test_deferral_is_scoped_to_the_building_thread():
    from radixlm.runtime.layers.linear import RowParallelLinear

    seen = {}
    with deferred_float_weights(object()):
        inside = RowParallelLinear(8, 4)
        t = threading.Thread(target=lambda: seen.setdefault("other", RowParallelLinear(8, 4)))
        t.start()
        t.join()
    after = RowParallelLinear(8, 4)
    assert inside.weight.is_meta
    assert not seen["other"].weight.is_meta and not after.weight.is_meta
    with deferred_float_weights(None):
        assert not RowParallelLinear(8, 4).weight.is_meta


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_load_peaks_at_the_quantized_model_and_leaves_nothing_cached(tmp_path):
    """On the device: online FP8 with dummy weights (each float weight drawn whole in float32, then quantized) peaks
    near the quantized model plus one layer's float32 draw, not at the float model, and returns its transients to the
    device (the KV pool is sized from free device memory)."""
    from radixlm.runtime.model_loader.loader import load_model

    config = LlamaConfig(**{**COMMON, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8})
    tiny_float(tmp_path, config, seed=0)
    cfg = ModelConfig.from_path(str(tmp_path), dtype="bfloat16", quantization="fp8")
    float_model = build_model(ModelConfig.from_path(str(tmp_path), dtype="bfloat16"), "meta")
    float_bytes = _bytes(m.weight for m in float_model.modules() if isinstance(m, QUANTIZABLE))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = load_model(cfg, "dummy", "cuda")
    held = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    assert held < float_bytes / 1.8
    # Above the model: one 4096 x 1024 float32 draw and its quantization's temporaries (~50 MB); the float model's
    # weights are 240 MB, the old build's peak above the model half of that.
    assert peak < held + float_bytes / 2.5, (peak, held, float_bytes)
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < (32 << 20)
    del model
