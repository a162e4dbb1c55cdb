"""Greedy parity with transformers (float32, CPU): a batch of prompts of different lengths run together
must give transformers' tokens (run one prompt at a time) exactly, and logprobs within 1e-3 — also with
radix-cache hits, the cache disabled, tiny chunked prefill (alone, and carrying decode rows: --mixed-chunk on),
a KV pool small enough to force retraction, and page_size > 1."""
from __future__ import annotations

import pytest

from .conftest import assert_matches, make_engine

GREEDY = {"temperature": 0, "max_new_tokens": 32}
# The scheduling modes decode half as far: a greedy run's first tokens are those of a longer one, so the reference's
# first MODE_TOKENS tokens (and their logprobs) are transformers' answer at that length.
MODE_TOKENS = 16


@pytest.mark.slow
def test_smollm2_batch_matches_transformers_and_radix_hits(smol_engine, smol_reference):
    prompts, ids, reference = smol_reference
    first = smol_engine.generate(prompts, GREEDY, return_logprob=True)
    assert_matches(first, reference, ids)
    second = smol_engine.generate(prompts, GREEDY, return_logprob=True)
    assert_matches(second, reference, ids)
    assert [r["meta_info"]["cached_tokens"] for r in second] == [len(i) - 1 for i in ids]
    assert len({len(i) for i in ids}) >= 5  # the prompts really differ in length


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [
    {"disable_radix_cache": True},
    {"chunked_prefill_size": 8},
    {"max_total_tokens": 200, "schedule_conservativeness": 0.05},
    {"page_size": 4},
    {"mixed_chunk": "on", "chunked_prefill_size": 16},
], ids=["no-radix", "chunked-8", "retraction", "page-4", "mixed-chunk-16"])
def test_smollm2_same_outputs_under_scheduling_modes(smol_reference, kwargs):
    prompts, ids, reference = smol_reference
    reference = [(new[:MODE_TOKENS], lps[:MODE_TOKENS]) for new, lps in reference]
    engine = make_engine("default", **kwargs)
    try:
        results = engine.generate(prompts, {**GREEDY, "max_new_tokens": MODE_TOKENS}, return_logprob=True)
        assert_matches(results, reference, ids)
        if "max_total_tokens" in kwargs:
            assert engine.scheduler.stats["retractions"] > 0
            assert sum(r["meta_info"]["num_retractions"] for r in results) > 0
        if kwargs.get("mixed_chunk") == "on":  # prompts' chunks carried the running requests' decode rows
            assert engine.scheduler.stats["mixed_batches"] > 0
        if kwargs.get("disable_radix_cache"):
            again = engine.generate(prompts, {**GREEDY, "max_new_tokens": 1})  # cached_tokens is the prefill's
            assert all(r["meta_info"]["cached_tokens"] == 0 for r in again)
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_smollm2_long_shared_system_prompt_matches_transformers(smol_engine, smol_references):
    """Prompts sharing a long system prompt: decode reads the shared radix prefix once per batch."""
    prompts, ids, reference = smol_references["shared_system"]
    results = smol_engine.generate(prompts, {"temperature": 0, "max_new_tokens": 24}, return_logprob=True)
    assert_matches(results, reference, ids)
    assert min(r["meta_info"]["cached_tokens"] for r in results[1:]) >= 64
