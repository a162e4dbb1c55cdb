"""Videos against transformers' own video pipeline: the frames the loader samples (PyAV) are the ones transformers'
decoder and its video processors' sampler pick for the same `num_frames`; where transformers' video processors load
(they need torchvision, which radixlm does not install: PyPI's Linux torchvision is a CUDA build that cannot import
beside the CPU torch) the runtime goes through them, and its pixels, grid, token counts, Qwen2.5-VL time spans and
greedy tokens equal transformers' processor + generate given only the video file; the fallback (frames through the
image processor) gives the same grid and nearly the same pixels. Without torchvision those tests are skipped."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from transformers.video_utils import VideoMetadata, default_sample_indices_fn, load_video

import radixlm
from radixlm.runtime.multimodal.media import MediaLoader, MediaPolicy, even_indices, temporal_patch_indices
from radixlm.runtime.multimodal.processor import load_video_processor
from tests.runtime.models.tiny_qwen2_vl import VIDEO, hf_greedy_video, mp4, save_tiny_qwen2_vl

if TYPE_CHECKING:
    from radixlm.runtime.multimodal.processor import MultimodalProcessor


def _has_video_processors() -> bool:
    try:
        import torchvision  # noqa: F401
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor  # noqa: F401
    except (ImportError, RuntimeError):  # not installed, or a build that cannot import beside this torch
        return False
    return True


needs_video_processors = pytest.mark.skipif(not _has_video_processors(),
                                            reason="transformers' video processors need an importable torchvision")
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def test_even_indices_are_transformers_default_sampler():
    for total in range(1, 50):
        for n in range(1, total + 1):
            ref = default_sample_indices_fn(VideoMetadata(total_num_frames=total, fps=4.0), num_frames=n).tolist()
            assert even_indices(total, n) == ref, (total, n)
    assert even_indices(3, 8) == [0, 1, 2]  # transformers refuses more frames than the video has; we take them all


def test_temporal_patch_indices_round_to_whole_patches():
    assert temporal_patch_indices(20, 3, 2) == even_indices(20, 4)  # 3 frames -> 2 temporal patches, like Qwen2-VL's
    assert temporal_patch_indices(20, 5, 2) == even_indices(20, 4)  # round half to even, as its processor does
    assert temporal_patch_indices(20, 1, 2) == [0]  # one frame stays one (the processor repeats it to a patch)
    assert temporal_patch_indices(3, 8, 2) == [0, 1, 2]


@pytest.mark.parametrize("total,n", [(9, 3), (9, 8), (12, 5), (7, 7)])
def test_sampled_frames_are_transformers_decoded_frames(tmp_path, total, n):
    """The loader's frames (and their positions) equal transformers' PyAV decoder's with its default sampler."""
    path = tmp_path / "clip.mp4"
    path.write_bytes(mp4(total, frames=total, rate=5))
    clip = MediaLoader(MediaPolicy(allowed_local_media_path=str(tmp_path))).load_clip(str(path), n)
    ref, meta = load_video(str(path), num_frames=n, backend="pyav")
    assert list(clip.indices) == list(meta.frames_indices)
    assert np.array_equal(np.stack([np.asarray(f) for f in clip.frames]), ref)
    meta.fps = 5.0
    assert clip.frame_interval_s == pytest.approx(1 / meta.sampled_fps)  # transformers' sampled rate


@needs_video_processors
def test_qwen2_vl_sampler_equals_transformers():
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    vp = Qwen2VLVideoProcessor()
    for total in range(1, 50):
        for n in range(1, 40):
            try:
                ref = vp.sample_frames(VideoMetadata(total_num_frames=total, fps=4.0), num_frames=n).tolist()
            except (ValueError, ZeroDivisionError):  # more frames than the video has, or one: refused there
                continue
            if len(ref) == len(temporal_patch_indices(total, n, 2)):  # float32 steps can add a frame past the end
                assert temporal_patch_indices(total, n, 2) == ref, (total, n)


def _reference(model_dir, path, num_frames: int, **kw):
    """transformers' pipeline given the file: its PyAV decoder (all frames and their metadata), then the model's video
    processor sampling `num_frames` of them with its own sampler (its own file decoding wants torchcodec)."""
    from transformers import AutoVideoProcessor

    video, meta = load_video(str(path), backend="pyav")
    return AutoVideoProcessor.from_pretrained(model_dir)(videos=[video], video_metadata=[meta], do_sample_frames=True,
                                                         num_frames=num_frames, return_tensors="pt", **kw)


def _save_onevision(path):
    """The tiny LLaVA-OneVision of test_llava_onevision, written to `path`."""
    from tests.runtime.models.test_llava_onevision import save_tiny_onevision

    return save_tiny_onevision(path)


def _qwen(tmp_path, v2_5: bool):
    hf = save_tiny_qwen2_vl(tmp_path, seed=7, v2_5=v2_5)
    return hf, radixlm.Engine(model_path=str(tmp_path), dtype="float32", enable_integrity_check=True)


@needs_video_processors
@pytest.mark.parametrize("v2_5", [False, True])
def test_qwen2_vl_video_equals_transformers_processor_and_generate(tmp_path, v2_5):
    """Given only the file: transformers' Qwen2-VL video processor decodes and samples it (num_frames=4 of 9);
    our engine's pixels, grid, time span and greedy tokens equal those and transformers' generate on them."""
    hf, engine = _qwen(tmp_path, v2_5)
    path = tmp_path / "clip.mp4"
    path.write_bytes(mp4(5, frames=9, size=(44, 30), rate=3))  # 44x30: resized to a multiple of 8
    prompt = f"t5 {VIDEO} t7 t8"
    try:
        mm = engine.builder.mm
        assert mm.video_processor is not None
        url = "data:video/mp4;num_frames=4;base64," + base64.b64encode(path.read_bytes()).decode()
        out = engine.generate(prompt, GREEDY, video_data=url)
        ids, item = engine.tokenizer.encode(prompt), mm.expand(engine.tokenizer.encode(prompt), [], [url])[1].items[0]
    finally:
        engine.shutdown()
    ref = _reference(tmp_path, path, 4, return_metadata=True)
    grid = ref["video_grid_thw"][0]
    assert item.grid_thw == tuple(grid.tolist()) and torch.equal(item.pixel_values, ref["pixel_values_videos"])
    span = None
    if v2_5:  # transformers' Qwen2.5-VL processor: temporal patch size / the sampled frames' rate
        span = 2 / ref["video_metadata"][0].sampled_fps
        assert item.second_per_grid_t == pytest.approx(span)
    assert out["output_ids"] == hf_greedy_video(hf, ids, ref["pixel_values_videos"], grid, GREEDY["max_new_tokens"],
                                                span)
    assert out["meta_info"]["prompt_tokens"] == len(ids) - 1 + int(grid.prod()) // 4


@needs_video_processors
def test_qwen2_vl_fallback_is_close_to_the_video_processor(tmp_path):
    """The fallback (each frame through the image processor, stacked into temporal patches) gives transformers'
    grid and layout; its pixels differ by the PIL vs torchvision resize alone."""
    hf, engine = _qwen(tmp_path, False)
    try:
        mm = engine.builder.mm
        clip = mm.loader.load_clip(mp4(6, frames=5, size=(44, 30)), 8, mm.sample_frames)
        ours = mm.preprocess_video(clip.frames)
        vp, mm.video_processor = mm.video_processor, None
        fallback = mm.preprocess_video(clip.frames)
        mm.video_processor = vp
    finally:
        engine.shutdown()
    assert fallback.grid_thw == ours.grid_thw and fallback.num_tokens == ours.num_tokens
    assert fallback.pixel_values.shape == ours.pixel_values.shape
    assert (fallback.pixel_values - ours.pixel_values).abs().mean() < 0.05  # normalized units (about +-2)


@needs_video_processors
def test_llava_onevision_video_equals_transformers_processor_and_generate(tmp_path):
    from tests.runtime.models.test_llava_onevision import NEW, VIDEO_TOKEN_ID

    hf = _save_onevision(tmp_path)
    path = tmp_path / "clip.mp4"
    path.write_bytes(mp4(8, frames=10, size=(40, 32)))
    prompt = "t5 t94 t7 t8"
    engine = radixlm.Engine(model_path=str(tmp_path), dtype="float32", enable_integrity_check=True)
    try:
        mm = engine.builder.mm
        assert mm.video_processor is not None and mm.hf_config.video_token_id == VIDEO_TOKEN_ID
        out = engine.generate(prompt, {**GREEDY, "max_new_tokens": NEW}, video_data=path.read_bytes())
        ids = engine.tokenizer.encode(prompt)
        item = mm.expand(ids, [], [path.read_bytes()])[1].items[0]
    finally:
        engine.shutdown()
    ref = _reference(tmp_path, path, 8)["pixel_values_videos"]
    assert torch.equal(item.pixel_values, ref[0])  # 8 of 10 frames, as transformers samples them
    count = 8 * 2 * 2 + 1
    expanded = torch.tensor([[t for tok in ids for t in ([tok] * count if tok == VIDEO_TOKEN_ID else [tok])]])
    with torch.inference_mode():
        gen = hf.generate(expanded, attention_mask=torch.ones_like(expanded), pixel_values_videos=ref,
                          max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out["output_ids"] == gen[0, expanded.shape[1]:].tolist()


def test_video_processor_is_none_without_torchvision(tmp_path):
    save_tiny_qwen2_vl(tmp_path, seed=1)
    assert (load_video_processor(str(tmp_path)) is None) == (not _has_video_processors())


# transformers' video processors' output for frames that need no resize (their sides already what the processor
# wants), where the fallback must agree exactly: it checks the fallback's layout (temporal patches, channel order,
# padding of the last patch, base views) against transformers without torchvision. Regenerate where torchvision
# imports: python -m tests.runtime.multimodal.test_video_processors
REFERENCE = Path(__file__).parent / "data" / "video_processor_reference.pt"
REFERENCE_SHAPES = {"qwen2_vl": (5, 16, 24), "llava_onevision": (3, 28, 28)}  # frames, height, width


def _processor(name: str, path) -> "MultimodalProcessor":
    from transformers import AutoTokenizer

    from radixlm.runtime.multimodal.processor import MultimodalProcessor

    save_tiny_qwen2_vl(path, seed=1) if name == "qwen2_vl" else _save_onevision(path)
    return MultimodalProcessor.for_model(str(path), AutoTokenizer.from_pretrained(path), MediaLoader(MediaPolicy()))


def _reference_from_transformers(tmp_path) -> dict:
    out = {}
    for i, (name, (n, h, w)) in enumerate(REFERENCE_SHAPES.items()):
        frames = torch.from_numpy(np.random.default_rng(i).integers(0, 256, (n, h, w, 3), dtype=np.uint8))
        mm = _processor(name, tmp_path / name)
        got = mm.video_processor(videos=[frames.numpy()], do_sample_frames=False, return_tensors="pt")
        out[name] = {"frames": frames, "pixel_values_videos": got["pixel_values_videos"].float()}
        if "video_grid_thw" in got:
            out[name]["video_grid_thw"] = got["video_grid_thw"]
    return out


@pytest.mark.parametrize("name", list(REFERENCE_SHAPES))
def test_fallback_equals_transformers_video_processor_reference(tmp_path, name):
    from PIL import Image

    ref = torch.load(REFERENCE, weights_only=True)[name]
    mm = _processor(name, tmp_path)
    mm.video_processor = None  # the path taken without torchvision
    got = mm.preprocess_video([Image.fromarray(f) for f in ref["frames"].numpy()])
    expected = ref["pixel_values_videos"]
    if name == "qwen2_vl":
        assert got.grid_thw == tuple(ref["video_grid_thw"][0].tolist()) == (3, 4, 6)  # 5 frames: the last repeated
        assert got.num_tokens == 3 * 4 * 6 // 4
    else:
        expected = expected[0]  # (frames, C, H, W)
        assert got.num_tokens == 3 * 2 * 2 + 1
    assert got.pixel_values.shape == expected.shape
    torch.testing.assert_close(got.pixel_values, expected, rtol=0, atol=1e-5)


@needs_video_processors
def test_reference_is_transformers_output(tmp_path):
    stored, fresh = torch.load(REFERENCE, weights_only=True), _reference_from_transformers(tmp_path)
    assert stored.keys() == fresh.keys()
    for name in fresh:
        for key, value in fresh[name].items():
            torch.testing.assert_close(stored[name][key], value, rtol=0, atol=0)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        REFERENCE.parent.mkdir(exist_ok=True)
        torch.save(_reference_from_transformers(Path(d)), REFERENCE)
    print(f"wrote {REFERENCE} ({REFERENCE.stat().st_size} bytes)")
