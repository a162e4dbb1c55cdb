"""Videos on the tiny Qwen2-VL: frames sampled with PyAV, stacked into temporal patches (a video of one frame
repeated is exactly that frame as an image); greedy tokens equal transformers' on the same patches; the same video
hits the cache; bad videos and models without video are refused."""
from __future__ import annotations

import base64
import io

import pytest
import torch
from PIL import Image

import radixlm
from radixlm.runtime.multimodal.media import MediaError, MediaLoader, MediaPolicy
from tests.runtime.models.tiny_llava import png
from tests.runtime.models.tiny_qwen2_vl import VIDEO, hf_greedy_video, mp4, save_tiny_qwen2_vl

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_vl")
    hf = save_tiny_qwen2_vl(path, seed=7)
    engine = radixlm.Engine(model_path=str(path), dtype="float32", enable_integrity_check=True, chunked_prefill_size=24)
    yield engine, hf
    engine.shutdown()


def test_frames_are_sampled_evenly():
    loader = MediaLoader(MediaPolicy())
    frames = loader.load_video(mp4(0, frames=9), num_frames=3)
    assert len(frames) == 3 and frames[0].size == (40, 32)
    assert len(loader.load_video(mp4(0, frames=2), num_frames=8)) == 2  # all of a short one
    with pytest.raises(MediaError, match="cannot decode the video"):
        loader.load_video(b"\x00not a video" * 10, num_frames=4)
    url = "data:video/mp4;num_frames={};base64," + base64.b64encode(mp4(0, frames=9)).decode()
    assert len(loader.load_video(url.format(5), num_frames=8)) == 5  # the data URL's own count
    with pytest.raises(MediaError, match="num_frames must be in"):
        loader.load_video(url.format(0), num_frames=8)


def test_a_still_video_is_its_frame_as_an_image(tiny):
    mm = tiny[0].builder.mm
    frame = Image.open(io.BytesIO(png(3, (40, 24)))).convert("RGB")
    video = mm.preprocess_video([frame, frame])
    image = mm.preprocess([frame])[0]
    assert video.grid_thw == image.grid_thw and video.num_tokens == image.num_tokens
    assert torch.equal(video.pixel_values, image.pixel_values)


def test_greedy_matches_transformers_and_hits_the_cache(tiny):
    engine, hf = tiny
    prompt = f"t5 {VIDEO} t7 t8"
    video = mp4(1, frames=5)
    out = engine.generate(prompt, GREEDY, video_data=video)
    again = engine.generate(prompt, GREEDY, video_data=video)
    other = engine.generate(prompt, GREEDY, video_data=mp4(2, frames=5))
    mm = engine.builder.mm
    processed = mm.preprocess_video(mm.loader.load_video(video, 8))
    assert processed.grid_thw[0] == 3  # 5 frames, the last repeated: 3 temporal patches
    ref = hf_greedy_video(hf, engine.tokenizer.encode(prompt), processed.pixel_values,
                          torch.tensor(processed.grid_thw), GREEDY["max_new_tokens"])
    assert out["output_ids"] == ref
    assert out["meta_info"]["prompt_tokens"] == 3 + processed.num_tokens + 2  # 't5 <|vision_start|>', '<|vision_end|> t7 t8'
    assert again["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
    assert other["meta_info"]["cached_tokens"] == 2  # another video: only 't5 <|vision_start|>' is shared


def test_refused_videos(tiny):
    engine = tiny[0]
    with pytest.raises(ValueError, match="video placeholder"):
        engine.generate("t5 t6", GREEDY, video_data=mp4(1))
    with pytest.raises(ValueError, match="cannot decode the video"):
        engine.generate(f"t5 {VIDEO}", GREEDY, video_data=b"\x00not a video" * 10)


def test_qwen2_5_vl_video_positions_follow_the_frame_rate(tmp_path):
    """Qwen2.5-VL spaces a video's time positions by the seconds its temporal patches span: greedy tokens equal
    transformers' given the same seconds; the same frames at another rate are another item (no cache hit past it)."""
    hf = save_tiny_qwen2_vl(tmp_path, seed=7, v2_5=True)
    engine = radixlm.Engine(model_path=str(tmp_path), dtype="float32", enable_integrity_check=True)
    try:
        prompt = f"t5 {VIDEO} t7 t8"
        fast, slow = mp4(1, frames=5, rate=4), mp4(1, frames=5, rate=1)
        out = engine.generate(prompt, GREEDY, video_data=fast)
        other = engine.generate(prompt, GREEDY, video_data=slow)
        mm = engine.builder.mm
        clip = mm.loader.load_clip(fast, 8)
        processed = mm.preprocess_video(clip.frames, clip.frame_interval_s)
        slow_clip = mm.loader.load_clip(slow, 8)
        ids = engine.tokenizer.encode(prompt)
    finally:
        engine.shutdown()
    assert processed.second_per_grid_t == pytest.approx(0.5)  # 2 frames a patch, 4 frames a second
    assert torch.equal(mm.preprocess_video(slow_clip.frames).pixel_values, processed.pixel_values)  # the same frames
    ref = hf_greedy_video(hf, ids, processed.pixel_values, torch.tensor(processed.grid_thw),
                          GREEDY["max_new_tokens"], processed.second_per_grid_t)
    assert out["output_ids"] == ref
    assert other["meta_info"]["cached_tokens"] == 2  # 't5 <|vision_start|>': the slower video's positions differ
    again = hf_greedy_video(hf, ids, processed.pixel_values, torch.tensor(processed.grid_thw),
                            GREEDY["max_new_tokens"], 2.0)  # the rate of `slow`
    assert other["output_ids"] == again
