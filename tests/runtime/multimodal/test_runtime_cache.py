"""Images in the radix tree and the encoder cache, on the tiny LLaVA through the offline Engine: the same image is a
cache hit (its pad ids match), another image is not; a chunked prefill through an image gives transformers' tokens and
encodes the image once; an image the radix cache covers is not encoded again."""
from __future__ import annotations

import pytest

import radixlm
from tests.runtime.models.tiny_llava import IMAGE_TOKEN, NUM_IMAGE_TOKENS, hf_greedy_with_image, png, save_tiny_llava

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
PROMPT = f"t5 t9 {IMAGE_TOKEN} t7 t8"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llava")
    return path, save_tiny_llava(path, seed=3)


def _engine(path, **kw):
    return radixlm.Engine(model_path=str(path), dtype="float32", enable_integrity_check=True, **kw)


def test_same_image_hits_the_cache_another_does_not(tiny):
    path, _ = tiny
    engine = _engine(path)
    try:
        first = engine.generate(PROMPT, GREEDY, image_data=png(1))
        cache = engine.runner.mm_embedder.cache
        encoded = cache.hits + cache.misses
        again = engine.generate(PROMPT, GREEDY, image_data=png(1))
        assert cache.hits + cache.misses == encoded  # the tree covered the image: no row needed its encoder output
        other = engine.generate(PROMPT, GREEDY, image_data=png(2))
    finally:
        engine.shutdown()
    prompt_len = 4 + NUM_IMAGE_TOKENS
    assert first["meta_info"]["prompt_tokens"] == prompt_len and first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] == prompt_len - 1  # all but the last prompt token
    assert again["output_ids"] == first["output_ids"]
    assert other["meta_info"]["cached_tokens"] == 2  # "t5 t9": the image differs from its first pad id on
    assert other["output_ids"] != first["output_ids"]


def test_chunked_prefill_through_an_image(tiny):
    path, hf = tiny
    engine = _engine(path, chunked_prefill_size=6)  # the image's 16 positions span three chunks
    try:
        out = engine.generate(PROMPT, GREEDY, image_data=png(4))
        cache = engine.runner.mm_embedder.cache
        misses, hits = cache.misses, cache.hits
        ids = engine.tokenizer.encode(PROMPT)
    finally:
        engine.shutdown()
    assert out["output_ids"] == hf_greedy_with_image(hf, path, ids, [png(4)], GREEDY["max_new_tokens"])
    assert (misses, hits) == (1, 2)  # encoded in the first chunk, read back by the next two
