"""LLaVA-NeXT (any-resolution tiling, our Llama on the paged KV cache): greedy tokens identical to transformers'
generate on images of different shapes (each picks its own tile grid and token count), float32 on CPU; the front's
token count equals transformers' packed feature length."""
from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor

import radixlm
from radixlm.runtime.multimodal import anyres
from tests.runtime.models.tiny_llava import IMAGE_TOKEN, hf_greedy_with_image, llava_config, png, save_tiny_llava

NEW = 8
# (width, height): wide, tall, square, very wide (1x3 tiles) and small
SHAPES = [(90, 40), (30, 70), (50, 50), (120, 30), (20, 16)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llava_next")
    return path, save_tiny_llava(path, seed=5, next_=True)


def test_token_count_matches_transformers(tiny):
    path, hf = tiny
    proc = AutoImageProcessor.from_pretrained(path)
    cfg = llava_config(next_=True)
    for i, size in enumerate(SHAPES):
        out = proc(images=[Image.open(io.BytesIO(png(i, size))).convert("RGB")], return_tensors="pt")
        with torch.inference_mode():
            feats = hf.model.get_image_features(out["pixel_values"], out["image_sizes"]).pooler_output
        image_size = tuple(out["image_sizes"][0].tolist())
        assert anyres.token_count(image_size, cfg) == feats[0].shape[0] <= anyres.max_token_count(cfg)


def test_greedy_matches_transformers(tiny):
    path, hf = tiny
    images = [png(i, size) for i, size in enumerate(SHAPES)]
    prompts = [f"t5 {IMAGE_TOKEN} t7 t8" for _ in images] + [f"{IMAGE_TOKEN} t3 {IMAGE_TOKEN} t4"]
    image_sets = [[im] for im in images] + [[images[0], images[2]]]
    engine = radixlm.Engine(model_path=str(path), dtype="float32", enable_integrity_check=True,
                            chunked_prefill_size=32)
    try:
        outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True},
                               image_data=image_sets)
        tok = engine.tokenizer
    finally:
        engine.shutdown()
    answers = set()
    for prompt, imgs, out in zip(prompts, image_sets, outs):
        assert out["output_ids"] == hf_greedy_with_image(hf, path, tok.encode(prompt), imgs, NEW)
        answers.add(tuple(out["output_ids"]))
    assert len(answers) > 3  # the answers depend on the images
