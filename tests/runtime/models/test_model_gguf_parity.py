"""The real default model (SmolLM2-135M GGUF): our conversion + model vs transformers' own GGUF path."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.files import resolve_model_path
from radixlm.runtime.model_loader.loader import load_model
from radixlm.runtime.model_loader.tokenizer import get_tokenizer

pytestmark = pytest.mark.slow


def test_smollm2_gguf_parity_with_transformers(dense_logits, hf_gguf_model):
    gguf_path = resolve_model_path("default")
    mc = ModelConfig.from_path("default", dtype="float32")
    assert mc.architecture == "LlamaForCausalLM" and mc.hf_config.tie_word_embeddings
    model = load_model(mc)
    tok = get_tokenizer("default")
    messages = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = torch.tensor(ids[-20:] if len(ids) > 20 else ids)
    assert len(ids) >= 15

    hf = hf_gguf_model(gguf_path)  # transformers' own GGUF path (converted once, kept between runs)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    ours = dense_logits(model, ids)
    assert (ours - ref).abs().max().item() < 1e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_smollm2_tokenizer_has_chat_template():
    tok = get_tokenizer("default")
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.rstrip().endswith("<|im_start|>assistant")
    mc = ModelConfig.from_path("default")
    assert tok.convert_tokens_to_ids("<|im_end|>") in mc.eos_token_ids
