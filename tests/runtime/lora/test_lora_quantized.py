"""LoRA adapters over a quantized base model (FP8 per channel, AWQ INT4): the adapter's delta is added to the
quantized GEMM's output, so greedy outputs equal the PEFT-merged transformers model built on the dequantized base
weights, token for token (float32, CPU)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

import radixlm
from tests.runtime.lora.tiny_adapters import make_adapter
from tests.runtime.models.tiny import hf_greedy, random_prompts, save_tiny
from tests.runtime.quantization import fp8_checkpoints as fp8
from tests.runtime.quantization.helpers import quantize_saved, reference_model
from tests.runtime.quantization.int4_checkpoints import Int4Spec, quantize_checkpoint

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
NEW = 8
SP = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}


def _quantized_base(fmt: str, path):
    """(the quantized checkpoint's directory, transformers' model of its dequantized weights)"""
    save_tiny(LlamaConfig(**CONFIG), path / "float", seed=2)
    if fmt == "fp8-channel":
        return path / "float", quantize_saved(path / "float", fp8.per_channel, {"quant_method": "w8a8_fp8"})
    quantize_checkpoint(path / "float", path / "awq", path / "ref", Int4Spec("awq", 32))
    return path / "awq", reference_model(path / "ref")


@pytest.mark.parametrize("fmt", ["fp8-channel", "awq"])
def test_adapter_over_a_quantized_base_equals_the_merged_dequantized_model(fmt, tmp_path):
    torch.set_num_threads(1)
    base_dir, dequantized = _quantized_base(fmt, tmp_path)
    merged = make_adapter(dequantized, tmp_path / "adapter", seed=7, r=8, alpha=16)
    prompts = random_prompts(4, [6, 10], CONFIG["vocab_size"])
    want = [t for t, _ in hf_greedy(merged, prompts, [], NEW)]
    base = [t for t, _ in hf_greedy(dequantized, prompts, [], NEW)]
    assert want != base
    with radixlm.Engine(str(base_dir), dtype="float32", device="cpu", max_total_tokens=1024,
                        lora_paths=[f"a={tmp_path / 'adapter'}"], max_lora_rank=8, max_loras_per_batch=2) as engine:
        outs = engine.generate(input_ids=prompts + prompts[:1], sampling_params=SP, lora_path=["a", "a", None])
        assert [o["output_ids"] for o in outs] == want + base[:1]
