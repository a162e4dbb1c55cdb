"""The --quantization flag end to end: the offline Engine (scheduler, KV cache, batched prompts of different
lengths) on quantized tiny models gives transformers' greedy tokens on the dequantized weights: online FP8 of a float
Mixtral (`quantization="fp8"`), and an FP8 block checkpoint detected from its config."""
from __future__ import annotations

import pytest

import radixlm
from tests.runtime.models.tiny import hf_greedy, random_prompts
from tests.runtime.quantization import fp8_checkpoints as fp8
from tests.runtime.quantization.helpers import VOCAB, dense_config, moe_config, quantize_saved, tiny_float

NEW_TOKENS = 10


@pytest.mark.parametrize("case", ["mixtral online fp8", "llama fp8 block"])
def test_engine_greedy_matches_dequantized_reference(case, tmp_path):
    if case.startswith("mixtral"):
        tiny_float(tmp_path, moe_config("mixtral"), seed=21)
        hf, flag = quantize_saved(tmp_path, fp8.per_channel, None, write=False), "fp8"
    else:
        tiny_float(tmp_path, dense_config("llama"), seed=22)
        hf = quantize_saved(tmp_path, fp8.block(32, 32), {"quant_method": "fp8", "weight_block_size": [32, 32]})
        flag = None
    prompts = random_prompts(5, [3, 14, 8], VOCAB)
    engine = radixlm.Engine(str(tmp_path), dtype="float32", device="cpu", random_seed=0, max_total_tokens=1024,
                            quantization=flag, enable_integrity_check=True)
    try:
        results = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS})
        reference = hf_greedy(hf, prompts, engine.model_config.eos_token_ids, NEW_TOKENS)
    finally:
        engine.shutdown()
    assert [r["output_ids"] for r in results] == [ids for ids, _ in reference]
