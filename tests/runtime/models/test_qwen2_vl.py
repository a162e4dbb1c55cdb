"""Qwen2-VL and Qwen2.5-VL (transformers' vision transformers, our Qwen2 with M-RoPE on the paged KV cache): greedy tokens identical to
transformers' generate on images of different sizes (their own patch grids), float32 on CPU, through chunked prefill;
the same image hits the cache."""
from __future__ import annotations

import pytest

import radixlm
from tests.runtime.models.tiny_llava import png
from tests.runtime.models.tiny_qwen2_vl import IMAGE, hf_greedy, save_tiny_qwen2_vl

NEW = 8
GREEDY = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}


@pytest.fixture(scope="module", params=["2", "2.5"])
def tiny(tmp_path_factory, request):
    path = tmp_path_factory.mktemp("qwen2_vl")
    return path, save_tiny_qwen2_vl(path, seed=7, v2_5=request.param == "2.5")


def test_greedy_matches_transformers(tiny):
    path, hf = tiny
    images = [png(1, (40, 24)), png(2, (30, 60)), png(3, (33, 33))]
    prompts = [f"t5 t9 {IMAGE} t7 t8", f"{IMAGE} t3", f"t6 {IMAGE} t12 {IMAGE} t13 t14"]
    image_sets = [[images[0]], [images[1]], [images[2], images[0]]]
    engine = radixlm.Engine(model_path=str(path), dtype="float32", enable_integrity_check=True,
                            chunked_prefill_size=16)
    try:
        outs = engine.generate(prompts, GREEDY, image_data=image_sets, return_logprob=True)
        again = engine.generate(prompts[0], GREEDY, image_data=image_sets[0])
        tok = engine.tokenizer
    finally:
        engine.shutdown()
    for prompt, imgs, out in zip(prompts, image_sets, outs):
        ref, ref_lps = hf_greedy(hf, path, tok.encode(prompt), imgs, NEW)
        assert out["output_ids"] == ref
        # logprobs too: the random model's argmax alone hardly tells positions apart
        lps = [lp for lp, _tok, _ in out["meta_info"]["output_token_logprobs"]]
        assert lps == pytest.approx(ref_lps, abs=1e-4)
    assert len({tuple(o["output_ids"]) for o in outs}) == 3
    assert again["output_ids"] == outs[0]["output_ids"]
    assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1
