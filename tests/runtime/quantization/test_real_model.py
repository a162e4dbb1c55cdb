"""A real model through the real tool: SmolLM2-135M-Instruct (the default model, converted from its GGUF) made
W8A8-FP8 (per-channel weights, dynamic per-token activations) and W4A16 (asymmetric, groups of 64, pack-quantized) by
the compressed-tensors library, served by the offline Engine with its tokenizer and chat prompts: greedy tokens equal
transformers' on the library's decompressed weights (float32). Real-model tier."""
from __future__ import annotations

import shutil

import pytest

import radixlm
from radixlm.runtime.model_loader.config import resolve_model_dir
from tests.runtime.models.tiny import hf_greedy
from tests.runtime.quantization.ct_checkpoints import quantize_ct, scheme

pytestmark = pytest.mark.slow
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
NEW_TOKENS = 8  # greedy equality of the quantized paths; a CPU decode step dequantizes the weights (16: 44 s)


@pytest.mark.parametrize("preset, options, fmt", [("FP8_DYNAMIC", {}, "float-quantized"),
                                                  ("W4A16_ASYM", {"group_size": 64}, "pack-quantized")])
def test_smollm2_compressed_tensors(preset, options, fmt, tmp_path):
    shutil.copytree(resolve_model_dir("default"), tmp_path / "m")
    hf = quantize_ct(tmp_path / "m", {"group_0": scheme(preset, **options)}, fmt, ignore=["lm_head"])
    engine = radixlm.Engine(str(tmp_path / "m"), dtype="float32", device="cpu", random_seed=0,
                            max_total_tokens=2048)
    try:
        tok = engine.tokenizer
        ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  tokenize=False), add_special_tokens=False) for p in PROMPTS]
        results = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS})
        reference = hf_greedy(hf, ids, engine.model_config.eos_token_ids, NEW_TOKENS)
    finally:
        engine.shutdown()
    assert [r["output_ids"] for r in results] == [r for r, _ in reference]
