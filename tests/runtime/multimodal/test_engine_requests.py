"""Multimodal requests at the edges, on the tiny LLaVA through the offline Engine: an image that ends the prompt,
penalties over a prompt holding pad ids, prompt logprobs only after the images, several images in a batch, and
requests the front refuses (no placeholder, an image beyond the context, a text-only model's image)."""
from __future__ import annotations

import pytest

import radixlm
from tests.runtime.models.tiny_llava import IMAGE_TOKEN, NUM_IMAGE_TOKENS, hf_greedy_with_image, png, save_tiny_llava

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llava")
    hf = save_tiny_llava(path, seed=3)
    engine = radixlm.Engine(model_path=str(path), dtype="float32", enable_integrity_check=True, context_length=64)
    yield engine, hf, path
    engine.shutdown()


def test_image_at_the_end_of_the_prompt(tiny):
    engine, hf, path = tiny
    out = engine.generate(f"t5 t6 {IMAGE_TOKEN}", GREEDY, image_data=png(1))
    assert out["output_ids"] == hf_greedy_with_image(hf, path, [5, 6, 95], [png(1)], 4)
    assert out["text"] == " ".join(f"t{t}" for t in out["output_ids"])


def test_penalties_over_pad_ids(tiny):
    engine = tiny[0]
    sp = dict(GREEDY, repetition_penalty=1.3, frequency_penalty=0.5)
    out = engine.generate(f"t5 {IMAGE_TOKEN} t6", sp, image_data=png(1))
    assert len(out["output_ids"]) == 4 and all(t < 96 for t in out["output_ids"])


def test_prompt_logprobs_only_after_the_images(tiny):
    engine = tiny[0]
    prompt = f"t5 {IMAGE_TOKEN} t6 t7"
    out = engine.generate(prompt, GREEDY, image_data=png(1), return_logprob=True,
                          logprob_start_len=1 + NUM_IMAGE_TOKENS)
    assert [tok for _lp, tok, _ in out["meta_info"]["input_token_logprobs"]][-2:] == [6, 7]
    with pytest.raises(ValueError, match="cannot cover image tokens"):
        engine.generate(prompt, GREEDY, image_data=png(1), return_logprob=True, logprob_start_len=NUM_IMAGE_TOKENS)


def test_batch_with_several_images_per_prompt(tiny):
    engine, hf, path = tiny
    prompts = [f"{IMAGE_TOKEN} t5 {IMAGE_TOKEN}", f"t6 {IMAGE_TOKEN}"]
    outs = engine.generate(prompts, GREEDY, image_data=[[png(1), png(2)], png(3)])
    assert outs[0]["output_ids"] == hf_greedy_with_image(hf, path, [95, 5, 95], [png(1), png(2)], 4)
    assert outs[1]["output_ids"] == hf_greedy_with_image(hf, path, [6, 95], [png(3)], 4)


def test_refused_requests(tiny):
    engine = tiny[0]
    with pytest.raises(ValueError, match="placeholder"):
        engine.generate("t5 t6", GREEDY, image_data=png(1))
    with pytest.raises(ValueError, match="placeholder"):
        engine.generate(f"t5 {IMAGE_TOKEN} {IMAGE_TOKEN}", GREEDY, image_data=png(1))
    four = " ".join([IMAGE_TOKEN] * 4)  # 64 image tokens: the context is 64
    with pytest.raises(ValueError, match="context length"):
        engine.generate(four, GREEDY, image_data=[png(i) for i in range(4)])
    assert engine.generate(f"t5 {IMAGE_TOKEN}", GREEDY, image_data=png(1))["output_ids"]  # still serving


def test_n_samples_share_the_prefilled_image(tiny):
    engine = tiny[0]
    outs = engine.generate(f"t5 {IMAGE_TOKEN} t6", {"temperature": 0.8, "max_new_tokens": 3, "n": 3,
                                                    "sampling_seed": 1}, image_data=png(5))
    # the prompt (image included) was prefilled once beforehand: every sample finds all of it but the last token
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [1 + NUM_IMAGE_TOKENS] * 3  # t5 and the image
