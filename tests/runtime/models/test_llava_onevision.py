"""LLaVA-OneVision (SigLIP tower, our Qwen2 on the paged KV cache): LLaVA-NeXT's tiling with the tile map capped (a
tiny cap, anyres_max_1, so that it shrinks), several images in one prompt encoded as base views alone, and videos
(frames' base views, features pooled 2x2, one newline); greedy tokens identical to transformers' generate, float32 on
CPU; the front's token counts equal transformers'."""
from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from transformers import (
    AutoImageProcessor, LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, Qwen2Config, SiglipVisionConfig,
)

import radixlm
from radixlm.runtime.multimodal import anyres
from tests.runtime.models.tiny import randomize
from tests.runtime.models.tiny_llava import (
    GRID_PINPOINTS, IMAGE_SIZE, IMAGE_TOKEN, IMAGE_TOKEN_ID, PATCH, VOCAB, png, save_tokenizer,
)

NEW = 8
VIDEO_TOKEN_ID = 94  # the word t94 stands for <video> (the tiny tokenizer has no such token)
SHAPES = [(90, 40), (50, 50), (30, 70), (20, 16)]  # (width, height)


def onevision_config() -> LlavaOnevisionConfig:
    text = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                image_size=IMAGE_SIZE, patch_size=PATCH)
    cfg = LlavaOnevisionConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN_ID,
                               video_token_index=VIDEO_TOKEN_ID,
                               image_grid_pinpoints=GRID_PINPOINTS, vision_aspect_ratio="anyres_max_1",
                               vision_feature_select_strategy="full", vision_feature_layer=-1)
    cfg.architectures = ["LlavaOnevisionForConditionalGeneration"]
    return cfg


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llava_onevision")
    return path, save_tiny_onevision(path)


def save_tiny_onevision(path):
    """The tiny LLaVA-OneVision (random weights, a stronger projector), its tokenizer and image processor, written
    to `path`; returns the transformers model."""
    from transformers.models.llava_onevision import LlavaOnevisionImageProcessorPil

    torch.manual_seed(4)
    hf = LlavaOnevisionForConditionalGeneration(onevision_config()).float()
    randomize(hf, 4)
    with torch.no_grad():
        hf.model.multi_modal_projector.linear_2.weight.mul_(10.0)
    hf.eval()
    hf.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    LlavaOnevisionImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                    image_grid_pinpoints=GRID_PINPOINTS).save_pretrained(path)
    return hf


def _hf(hf, path, ids, images):
    processed = AutoImageProcessor.from_pretrained(path)(
        images=[Image.open(io.BytesIO(b)).convert("RGB") for b in images], return_tensors="pt")
    extra = {"image_sizes": processed["image_sizes"], "batch_num_images": torch.tensor([len(images)])}
    with torch.inference_mode():
        feats = hf.model.get_image_features(processed["pixel_values"], **extra).pooler_output
        counts = iter([f.shape[0] for f in feats])
        expanded = [t for tok in ids for t in ([tok] * next(counts) if tok == IMAGE_TOKEN_ID else [tok])]
        ids_t = torch.tensor([expanded])
        out = hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), pixel_values=processed["pixel_values"],
                          max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0, **extra)
    return out[0, len(expanded):].tolist(), [f.shape[0] for f in feats]


def test_greedy_and_token_counts_match_transformers(tiny):
    path, hf = tiny
    images = [png(i, size) for i, size in enumerate(SHAPES)]
    prompts = [f"t5 {IMAGE_TOKEN} t7" for _ in images] + [f"{IMAGE_TOKEN} t3 {IMAGE_TOKEN} t4"]
    image_sets = [[im] for im in images] + [[images[0], images[1]]]
    engine = radixlm.Engine(model_path=str(path), dtype="float32", enable_integrity_check=True)
    try:
        outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True},
                               image_data=image_sets)
        tok = engine.tokenizer
    finally:
        engine.shutdown()
    all_counts = []
    for prompt, imgs, out in zip(prompts, image_sets, outs):
        ids = tok.encode(prompt)
        ref, counts = _hf(hf, path, ids, imgs)
        assert out["output_ids"] == ref
        assert out["meta_info"]["prompt_tokens"] == len(ids) - len(imgs) + sum(counts)
        all_counts.append(counts)
    # 50x50: 2x2 tiles, an 8x8 map over the cap of 1 tile (4x4 = 16 cells), shrunk to 4x4: 16 base + 4 rows of 4 + 1
    assert all_counts[1] == [16 + 4 * 5] == [anyres.token_count((50, 50), onevision_config())]
    assert all_counts[-1] == [17, 17]  # two images in a prompt: base views (16 tokens) and a newline each


def test_video_greedy_matches_transformers(tiny):
    """A video's frames (PyAV, sampled evenly) as base views, each 4x4 feature map pooled to 2x2, one newline after
    the last; greedy tokens equal transformers' on the same frames; the same video hits the cache, another does
    not and answers otherwise."""
    from tests.runtime.models.tiny_qwen2_vl import mp4

    path, hf = tiny
    prompt = "t5 t94 t7 t8"
    video = mp4(1, frames=5, size=(40, 32))
    engine = radixlm.Engine(model_path=str(path), dtype="float32", enable_integrity_check=True, chunked_prefill_size=16)
    try:
        greedy = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
        out = engine.generate(prompt, greedy, video_data=video, return_logprob=True)
        again = engine.generate(prompt, greedy, video_data=video)
        other = engine.generate(prompt, greedy, video_data=mp4(2, frames=5, size=(40, 32)), return_logprob=True)
        mm = engine.builder.mm
        frames = mm.preprocess_video(mm.loader.load_video(video, 8)).pixel_values
        ids = engine.tokenizer.encode(prompt)
    finally:
        engine.shutdown()
    assert frames.shape == (5, 3, IMAGE_SIZE, IMAGE_SIZE)
    count = 5 * 2 * 2 + 1  # a 4x4 feature map pooled to 2x2 per frame, one newline
    assert out["meta_info"]["prompt_tokens"] == len(ids) - 1 + count
    expanded = [t for tok in ids for t in ([tok] * count if tok == VIDEO_TOKEN_ID else [tok])]
    ids_t = torch.tensor([expanded])
    with torch.inference_mode():
        ref = hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), pixel_values_videos=frames[None],
                          max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True,
                          return_dict_in_generate=True)
    new = ref.sequences[0, len(expanded):].tolist()
    assert out["output_ids"] == new
    # logprobs too: this random model's argmax hardly depends on the video
    lps = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    assert lps == pytest.approx([torch.log_softmax(lg[0], -1)[t].item() for lg, t in zip(ref.logits, new)], abs=1e-4)
    assert again["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
    assert other["meta_info"]["cached_tokens"] == 1
    assert [lp for lp, _, _ in other["meta_info"]["output_token_logprobs"]] != pytest.approx(lps, abs=1e-3)


@pytest.mark.parametrize("side", [4, 5, 27])  # 27: the 7B model's 384 / 14 (pooled to 14, not an even halving)
def test_video_pooling_equals_transformers(side):
    from types import SimpleNamespace

    from transformers.models.llava_onevision.modeling_llava_onevision import LlavaOnevisionModel

    from radixlm.runtime.models.llava_next import LlavaOnevisionForConditionalGeneration as Ours
    from radixlm.runtime.multimodal.inputs import Modality, MultimodalItem

    cfg = SimpleNamespace(vision_config=SimpleNamespace(image_size=side * 7, patch_size=7))
    feats = torch.randn(3, side * side, 8, generator=torch.Generator().manual_seed(side))
    newline = torch.randn(8)
    ours = Ours._pack_item(SimpleNamespace(config=cfg, image_newline=newline), feats,
                           MultimodalItem(Modality.VIDEO, "v", feats, 0, 0))
    theirs = LlavaOnevisionModel.apply_pooling(SimpleNamespace(config=cfg), feats).reshape(-1, 8)
    assert torch.equal(ours, torch.cat([theirs, newline[None]]))
    assert len(ours) == anyres.video_token_count(3, cfg)
