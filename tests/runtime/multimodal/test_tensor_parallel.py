"""Vision-language models on 2 gloo ranks (the CPU stand-in for 2 GPUs): every rank receives the request's media,
encodes it with its replicated tower and embeds it into its shard of the language model; greedy tokens equal
transformers' (LLaVA-1.5, and Qwen2-VL with its multimodal positions)."""
from __future__ import annotations

import pytest

import radixlm
from tests.runtime.models.tiny_llava import IMAGE_TOKEN, hf_greedy_with_image, png, save_tiny_llava
from tests.runtime.models.tiny_qwen2_vl import IMAGE, hf_greedy, save_tiny_qwen2_vl

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def _generate(path, prompts, images):
    engine = radixlm.Engine(str(path), dtype="float32", device="cpu", tp_size=2, max_total_tokens=2048,
                            enable_integrity_check=True, chunked_prefill_size=12)
    try:
        return engine.generate(prompts, GREEDY, image_data=images), engine.tokenizer
    finally:
        engine.shutdown()


def test_llava_on_two_ranks(tmp_path):
    hf = save_tiny_llava(tmp_path, seed=3)
    prompts, images = [f"t5 {IMAGE_TOKEN} t7", f"{IMAGE_TOKEN} t3 t4"], [[png(1)], [png(2)]]
    outs, tok = _generate(tmp_path, prompts, images)
    for p, imgs, out in zip(prompts, images, outs):
        assert out["output_ids"] == hf_greedy_with_image(hf, tmp_path, tok.encode(p), imgs, 6)


def test_qwen2_vl_on_two_ranks(tmp_path):
    hf = save_tiny_qwen2_vl(tmp_path, seed=7)
    prompts, images = [f"t5 {IMAGE} t7", f"{IMAGE} t3 t4"], [[png(1, (40, 24))], [png(2, (30, 60))]]
    outs, tok = _generate(tmp_path, prompts, images)
    for p, imgs, out in zip(prompts, images, outs):
        assert out["output_ids"] == hf_greedy(hf, tmp_path, tok.encode(p), imgs, 6)[0]
