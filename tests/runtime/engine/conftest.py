"""Real-model fixtures: SmolLM2-135M (Llama path) and Qwen2.5-0.5B (Qwen2 path), float32 on CPU, with
transformers as the reference (loading the same GGUF through its own dequantizer)."""
from __future__ import annotations

import os

import pytest
import torch

import radixlm
from radixlm.runtime.model_loader.files import resolve_model_path

# Prompts of different lengths (chat-templated at run time), run together in one batch.
QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Name three colors.",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue.",
    "List the first five prime numbers and explain briefly how you found them.",
    "Translate 'good morning' into Spanish, French and German, one per line.",
    "You are a careful assistant. Summarize the plot of Romeo and Juliet in two sentences, "
    "mentioning the families involved and how the story ends for the two lovers.",
    "Count from one to ten in words.",
]


def chat_prompts(tokenizer) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in QUESTIONS]


def hf_reference(gguf_path: str, prompts_ids: list[list[int]], max_new_tokens: int, eos_ids) -> list[tuple[list[int], list[float]]]:
    """transformers greedy, one prompt at a time: (new token ids, their logprobs)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    ).eval()
    out = []
    with torch.inference_mode():
        for ids in prompts_ids:
            gen = model.generate(
                torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(eos_ids),
                pad_token_id=sorted(eos_ids)[0], output_logits=True, return_dict_in_generate=True,
            )
            new = gen.sequences[0, len(ids):].tolist()
            lps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(gen.logits, new)]
            out.append((new, lps))
    return out


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(2)


# A fixed KV pool of 380 MB (the CPU default is a share of the machine's memory, 1.2 GB on 24 GB): the tests' batches use
# a few thousand tokens, and a run holds an engine or two at a time.
TEST_MAX_TOTAL_TOKENS = 8192


def make_engine(model: str = "default", **kwargs) -> "radixlm.Engine":
    kwargs.setdefault("max_total_tokens", TEST_MAX_TOTAL_TOKENS)
    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("enable_integrity_check", True)
    kwargs.setdefault("random_seed", 0)
    return radixlm.Engine(model, **kwargs)


@pytest.fixture(scope="package")  # gone when the run leaves tests/runtime/engine
def smol_engine():
    engine = make_engine("default")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="package")
def smol_reference(smol_engine):
    prompts = chat_prompts(smol_engine.tokenizer)
    ids = [smol_engine.tokenizer.encode(p) for p in prompts]
    return prompts, ids, hf_reference(resolve_model_path("default"), ids, 32, smol_engine.model_config.eos_token_ids)
