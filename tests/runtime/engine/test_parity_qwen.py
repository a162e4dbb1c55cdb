"""Greedy parity with transformers for Qwen2.5-0.5B (float32, CPU): qkv biases and tied embeddings, a batch of chat
prompts against transformers' model of the same GGUF file (its own dequantizer). Apart from test_parity.py's SmolLM2
cases: it is the suite's slowest test, and under xdist's loadfile a module runs on one worker."""
from __future__ import annotations

import gc
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from radixlm.runtime.model_loader.files import resolve_model_path

from .conftest import assert_matches, chat_prompts, hf_reference, make_engine

# 142 s on CI's two cores at 32 tokens a prompt: the architecture's parity needs no more than 16.
QWEN_GREEDY = {"temperature": 0, "max_new_tokens": 16}


def _qwen25_outputs_and_reference() -> tuple[list[list[int]], list[dict], list]:
    engine = make_engine("qwen2.5-0.5b")
    try:
        prompts = chat_prompts(engine.tokenizer)
        ids = [engine.tokenizer.encode(p) for p in prompts]
        results = engine.generate(prompts, QWEN_GREEDY, return_logprob=True)
        eos = engine.model_config.eos_token_ids
    finally:
        engine.shutdown()
    del engine  # the reference loads a second copy of the weights: not both at once
    gc.collect()
    return ids, results, hf_reference(resolve_model_path("qwen2.5-0.5b"), ids, QWEN_GREEDY["max_new_tokens"], eos)


@pytest.mark.slow
def test_qwen25_batch_matches_transformers():
    # A spawned process: the engine (its oneDNN-packed weights and the tied embedding, ~3.5 GB) and the reference are
    # freed with it, never stacked on the heap of a test worker that has run other tests (the suite's 8 GB peak).
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        ids, results, reference = pool.submit(_qwen25_outputs_and_reference).result()
    assert_matches(results, reference, ids)
