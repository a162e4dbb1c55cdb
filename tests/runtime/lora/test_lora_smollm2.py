"""A PEFT adapter on the real SmolLM2-135M (the default model, transformers' model from its GGUF: hf_gguf_model):
greedy outputs equal the PEFT-merged model's token for token in float32, next to the base model in one batch."""
from __future__ import annotations

import torch

import radixlm
from radixlm.runtime.model_loader.files import resolve_model_path
from tests.runtime.lora.tiny_adapters import make_adapter
from tests.runtime.models.tiny import hf_greedy

NEW = 12


def test_smollm2_adapter_equals_the_peft_merged_model(hf_gguf_model, tmp_path):
    torch.set_num_threads(1)
    hf = hf_gguf_model(resolve_model_path("default"))
    # Every projection but k (a fused part left alone), rank 8, rsLoRA (scaling 2 / sqrt(8): answers stay fluent).
    merged = make_adapter(hf, tmp_path / "smol", seed=5, r=8, alpha=2, rslora=True,
                          targets=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    with radixlm.Engine("default", dtype="float32", device="cpu", max_total_tokens=1024,
                        lora_paths=[f"smol={tmp_path / 'smol'}"]) as engine:
        prompt = engine.tokenizer.encode("The capital of France is")
        outs = engine.generate(input_ids=[prompt, prompt], lora_path=["smol", None],
                               sampling_params={"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True})
    ((want, _),) = hf_greedy(merged, [prompt], [], NEW)
    assert outs[0]["output_ids"] == want
    assert outs[1]["output_ids"] != want  # the adapter changes the answer
