"""compressed-tensors W4A16 checkpoints made by the library itself (its W4A16 / W4A16_ASYM presets, its
calculate_qparams and pack-quantized compressor), dense and MoE: radixlm's greedy tokens equal transformers' on the
library's decompressed weights (float32, CPU). The real model (SmolLM2-135M) in the real-model tier."""
from __future__ import annotations

import shutil

import pytest

import radixlm
from tests.runtime.models.tiny import hf_greedy
from tests.runtime.quantization.ct_checkpoints import quantize_ct, scheme
from tests.runtime.quantization.helpers import assert_greedy_matches, dense_config, moe_config, tiny_float

PACKED = "pack-quantized"
MOE_IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$", "re:.*shared_expert_gate$"]
SCHEMES = {
    "w4a16-group": lambda: scheme("W4A16", group_size=32),
    "w4a16-asym-group": lambda: scheme("W4A16_ASYM", group_size=16),
    "w4a16-channel": lambda: scheme("W4A16", strategy="channel", group_size=None),
}


@pytest.mark.parametrize("name, kind", [("w4a16-group", "llama"), ("w4a16-asym-group", "qwen2"),
                                        ("w4a16-channel", "llama"), ("w4a16-asym-group", "mixtral"),
                                        ("w4a16-group", "qwen2_moe")])
def test_library_made_w4a16(name, kind, tmp_path):
    config = moe_config(kind) if kind in ("mixtral", "qwen2_moe") else dense_config(kind)
    tiny_float(tmp_path / "m", config, seed=21)
    hf = quantize_ct(tmp_path / "m", {"group_0": SCHEMES[name]()}, PACKED,
                     ignore=MOE_IGNORE if kind in ("mixtral", "qwen2_moe") else ["lm_head"])
    assert_greedy_matches(tmp_path / "m", hf)


@pytest.mark.slow
def test_smollm2_compressed_tensors_w4a16(tmp_path):
    from radixlm.runtime.model_loader.config import resolve_model_dir

    shutil.copytree(resolve_model_dir("default"), tmp_path / "m")
    hf = quantize_ct(tmp_path / "m", {"group_0": scheme("W4A16_ASYM", group_size=64)}, PACKED, ignore=["lm_head"])
    engine = radixlm.Engine(str(tmp_path / "m"), dtype="float32", device="cpu", random_seed=0, max_total_tokens=2048)
    try:
        tok = engine.tokenizer
        prompts = ["What is the capital of France?", "Write a haiku about the sea."]
        ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  tokenize=False), add_special_tokens=False) for p in prompts]
        results = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 16})
        reference = hf_greedy(hf, ids, engine.model_config.eos_token_ids, 16)
    finally:
        engine.shutdown()
    assert [r["output_ids"] for r in results] == [r for r, _ in reference]
