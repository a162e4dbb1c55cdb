"""Real-model fixtures: SmolLM2-135M (Llama path) and Qwen2.5-0.5B (Qwen2 path), float32 on CPU, with
transformers as the reference (loading the same GGUF through its own dequantizer)."""
from __future__ import annotations

import pytest
import torch

import radixlm
from radixlm.runtime.model_loader.files import resolve_model_path
from tests.hf_gguf import load_hf_gguf
from tests.threads import worker_threads

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


# Prompts sharing a long system prompt (chat-templated at run time).
SHARED_SYSTEM = ("You are the assistant of a small museum of clocks. The museum opens at ten, closes at six, and is "
                 "closed on Mondays. Tickets cost eight euros, four for students. Guided tours start every hour on the "
                 "hour and last forty minutes. Answer briefly and politely.")
SHARED_QUESTIONS = ["When do you open?", "How much is a ticket?", "Are you open on Monday?", "How long is a tour?",
                    "Do students pay less?", "When does the last tour start?", "Can I bring a dog?", "Hello!"]


def chat_prompts(tokenizer) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in QUESTIONS]


def shared_system_prompts(tokenizer) -> list[str]:
    turns = [[{"role": "system", "content": SHARED_SYSTEM}, {"role": "user", "content": q}] for q in SHARED_QUESTIONS]
    return [tokenizer.apply_chat_template(t, tokenize=False, add_generation_prompt=True) for t in turns]


def hf_reference(gguf_path: str, prompts_ids: list[list[int]], max_new_tokens: int,
                 eos_ids) -> list[tuple[list[int], list[float]]]:
    return hf_greedy(load_hf_gguf(gguf_path), prompts_ids, max_new_tokens, eos_ids)


def hf_greedy(model, prompts_ids: list[list[int]], max_new_tokens: int, eos_ids) -> list[tuple[list[int], list[float]]]:
    """transformers greedy: (new token ids, their logprobs) per prompt. The prompts run as one left-padded batch (each
    row attends to its own tokens, at its own positions): on the CPU a decode step reads every weight once for the
    batch instead of once per prompt (0.5B in float32 is 2 GB a step)."""
    eos = sorted(eos_ids)
    width = max(map(len, prompts_ids))
    input_ids = torch.tensor([[eos[0]] * (width - len(ids)) + ids for ids in prompts_ids])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts_ids])
    with torch.inference_mode():
        gen = model.generate(
            input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
            pad_token_id=eos[0], output_logits=True, return_dict_in_generate=True,
        )
    out = []
    for row in range(len(prompts_ids)):
        new = gen.sequences[row, width:].tolist()
        # A row that finished pads to the batch's end: its tokens stop at its first EOS.
        end = next((i + 1 for i, t in enumerate(new) if t in eos_ids), len(new))
        new = new[:end]
        lps = [torch.log_softmax(gen.logits[step][row].float(), -1)[t].item() for step, t in enumerate(new)]
        out.append((new, lps))
    return out


def assert_matches(results, reference, prompt_ids):
    assert len(results) == len(reference) >= 8
    for res, (ref_ids, ref_lps), ids in zip(results, reference, prompt_ids):
        assert res["output_ids"] == ref_ids
        got = [lp for lp, _tok, _text in res["meta_info"]["output_token_logprobs"]]
        assert len(got) == len(ref_lps)
        assert max(abs(a - b) for a, b in zip(got, ref_lps)) < 1e-3
        assert res["meta_info"]["prompt_tokens"] == len(ids)
        assert res["meta_info"]["completion_tokens"] == len(ref_ids)


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(worker_threads())


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
def smol_references(smol_engine, hf_gguf_model) -> dict[str, tuple[list[str], list[list[int]], list]]:
    """transformers' greedy answers to the chat prompts (32 tokens) and the shared-system prompts (24 tokens), from one
    load of its model, which is freed before the tests run."""
    tok, eos = smol_engine.tokenizer, smol_engine.model_config.eos_token_ids
    model = hf_gguf_model(resolve_model_path("default"))
    out = {}
    for name, prompts, max_new_tokens in (("chat", chat_prompts(tok), 32),
                                          ("shared_system", shared_system_prompts(tok), 24)):
        ids = [tok.encode(p) for p in prompts]
        out[name] = (prompts, ids, hf_greedy(model, ids, max_new_tokens, eos))
    return out


@pytest.fixture(scope="package")
def smol_reference(smol_references):
    return smol_references["chat"]
