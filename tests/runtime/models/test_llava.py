"""LLaVA-1.5 (CLIP tower, or SigLIP with the full strategy; our Llama / Qwen2 on the paged KV cache): greedy tokens
identical to transformers' generate on the same images, float32 on CPU."""
from __future__ import annotations

import base64

import pytest

import radixlm
from tests.runtime.models.tiny_llava import IMAGE_TOKEN, hf_greedy_with_image, png, save_tiny_llava

NEW = 8


@pytest.mark.parametrize("text, tower", [("llama", "clip"), ("qwen2", "clip"), ("qwen2", "siglip")])
def test_greedy_matches_transformers(tmp_path, text, tower):
    hf = save_tiny_llava(tmp_path, text, seed=3, tower=tower)
    images = [png(1), png(2, (30, 50))]
    prompts = [f"t5 t9 {IMAGE_TOKEN} t7 t8 t11", f"{IMAGE_TOKEN} t3 t4", f"t6 {IMAGE_TOKEN} t12 {IMAGE_TOKEN} t13"]
    image_sets = [[images[0]], [images[1]], images]
    engine = radixlm.Engine(model_path=str(tmp_path), dtype="float32", enable_integrity_check=True)
    try:
        outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True},
                               image_data=[[base64.b64encode(i).decode() for i in s] for s in image_sets])
        tok = engine.tokenizer
    finally:
        engine.shutdown()
    for prompt, imgs, out in zip(prompts, image_sets, outs):
        ref = hf_greedy_with_image(hf, tmp_path, tok.encode(prompt), imgs, NEW)
        assert out["output_ids"] == ref
        assert out["meta_info"]["prompt_tokens"] == len(tok.encode(prompt)) + 15 * len(imgs)
