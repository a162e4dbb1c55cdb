"""The offline Engine with --speculative-algorithm RADIX on a tiny random-weight Llama (a word-level tokenizer:
prompts are token ids): a second request asking what an earlier one was answered drafts that answer from the radix
cache, keeps it, and reports it in meta_info; outputs are those of the same engine without speculation."""
from __future__ import annotations

import json

import pytest
import torch

import radixlm
from tests.runtime.models.tiny import word_tokenizer
from tests.runtime.scheduler.conftest import TINY_LLAMA

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("tiny-llama-tok")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    word_tokenizer(d, TINY_LLAMA["vocab_size"])
    return str(d)


def test_asked_again_the_engine_drafts_the_cached_answer(tiny_dir):
    torch.set_num_threads(1)
    prompt = [(13 * j) % 500 + 3 for j in range(20)]
    sp = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    runs = {}
    for algo in (None, "RADIX"):
        engine = radixlm.Engine(tiny_dir, load_format="dummy", dtype="float32", device="cpu", random_seed=0,
                                max_total_tokens=2048, enable_integrity_check=True, speculative_algorithm=algo,
                                speculative_measure_window=0)  # drafting wherever the source drafts (counted)
        try:
            runs[algo] = [engine.generate(input_ids=prompt, sampling_params=sp) for _ in range(2)]
        finally:
            engine.shutdown()
    first, again = runs["RADIX"]
    assert [r["output_ids"] for r in runs["RADIX"]] == [r["output_ids"] for r in runs[None]]
    assert again["output_ids"] == first["output_ids"] and len(first["output_ids"]) == 16
    assert "spec_verify_ct" not in first["meta_info"]  # nothing cached to draft from the first time
    meta = again["meta_info"]
    # The prefill verifies a draft of 4 cached tokens, each decode pass 4 more: 16 tokens, all kept but the sampled.
    assert meta["spec_accepted_tokens"] == meta["spec_draft_tokens"] >= 12
    assert meta["spec_verify_ct"] <= 4 and meta["cached_tokens"] > 0


def test_standalone_draft_model_through_the_engine(tmp_path):
    """--speculative-algorithm STANDALONE with the target's own checkpoint as the draft: n > 1 samples (their shared
    prompt prefilled once, then hit in the cache) get the outputs of speculation off, nearly every draft token is
    kept, and meta_info reports it."""
    from transformers import LlamaConfig

    from tests.runtime.models.tiny import save_tiny

    torch.set_num_threads(1)
    save_tiny(LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "architectures"}), tmp_path)
    prompts = [[(7 * j) % 500 + 3 for j in range(18)], [(11 * j) % 500 + 3 for j in range(9)]]
    sp = {"temperature": 0, "max_new_tokens": 13, "ignore_eos": True, "n": 2}
    runs = {}
    for algo in (None, "STANDALONE"):
        engine = radixlm.Engine(str(tmp_path), dtype="float32", device="cpu", random_seed=0, max_total_tokens=2048,
                                enable_integrity_check=True, speculative_algorithm=algo,
                                speculative_draft_model_path=str(tmp_path) if algo else None,
                                speculative_measure_window=0)  # drafting wherever the source drafts (counted)
        try:
            runs[algo] = engine.generate(input_ids=prompts, sampling_params=sp)
        finally:
            engine.shutdown()
    assert [r["output_ids"] for r in runs["STANDALONE"]] == [r["output_ids"] for r in runs[None]]
    assert len(runs[None]) == 4 and all(len(r["output_ids"]) == 13 for r in runs[None])
    metas = [r["meta_info"] for r in runs["STANDALONE"]]
    assert all(m["spec_verify_ct"] > 0 for m in metas)
    kept, drafted = sum(m["spec_accepted_tokens"] for m in metas), sum(m["spec_draft_tokens"] for m in metas)
    assert kept >= 0.9 * drafted and kept >= 4 * 8, (kept, drafted)
