"""The front's half of multimodal requests: images through the model's own transformers image processor, each hashed,
and the prompt's image placeholder token expanded to the image's token count, holding the image's pad ids."""
from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.runtime.multimodal import anyres
from radixlm.runtime.multimodal.inputs import (
    Modality, MultimodalInputs, MultimodalItem, content_hash, mrope_positions, pad_ids,
)
from radixlm.runtime.multimodal.media import MediaError, MediaLoader, even_indices, temporal_patch_indices

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

logger = logging.getLogger(__name__)

MAX_IMAGES_PER_REQUEST = 64
DEFAULT_VIDEO_FRAMES = 8  # frames sampled from a video, evenly over its length


# Vision towers whose output starts with a CLS token (SigLIP's does not).
TOWERS_WITH_CLS = ("clip_vision_model",)


def load_video_processor(model_dir: str):
    """transformers' own video processor of the model, or None where it cannot load: it needs torchvision, which
    radixlm does not install (PyPI's Linux torchvision is a CUDA build that cannot import beside the CPU torch)."""
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        return None
    try:
        import torchvision  # noqa: F401 - a torchvision that is installed but cannot import (a mismatched build)
        from transformers import AutoVideoProcessor

        return AutoVideoProcessor.from_pretrained(model_dir)
    except (ImportError, OSError, RuntimeError, ValueError) as e:
        logger.warning("transformers' video processor did not load (%s: %s); videos go through the image processor",
                       type(e).__name__, e)
        return None


class ImageLayout(str, enum.Enum):
    """How a model turns an image into tokens."""

    FIXED = "fixed"  # LLaVA-1.5: one view at the tower's resolution, a token per patch
    TILED = "tiled"  # LLaVA-NeXT: the base view and the tiles of a grid that suits the image (anyres)
    DYNAMIC = "dynamic"  # Qwen2-VL: patches at the image's own (resized) resolution, merged; M-RoPE positions


class VideoLayout(str, enum.Enum):
    """How a model turns a video's frames into tokens."""

    NONE = "none"  # no videos
    TEMPORAL_PATCHES = "temporal_patches"  # Qwen2-VL: consecutive frames stacked into the encoder's temporal patches
    POOLED_FRAMES = "pooled_frames"  # LLaVA-OneVision: each frame's base view, its features pooled 2x2; one newline


def video_layout_of(hf_config) -> VideoLayout:
    if getattr(hf_config, "video_token_id", None) is None:
        return VideoLayout.NONE
    layout = layout_of(hf_config)
    if layout is ImageLayout.DYNAMIC:
        return VideoLayout.TEMPORAL_PATCHES
    if layout is ImageLayout.TILED and anyres.max_tiles(hf_config) is not None:
        return VideoLayout.POOLED_FRAMES
    return VideoLayout.NONE


def layout_of(hf_config) -> ImageLayout:
    if getattr(hf_config.vision_config, "spatial_merge_size", None):
        return ImageLayout.DYNAMIC
    return ImageLayout.TILED if getattr(hf_config, "image_grid_pinpoints", None) else ImageLayout.FIXED


def image_token_count(hf_config, image_processor=None) -> int:
    """Tokens per image, or the most an image can take where its size decides. LLaVA-1.5: the tower's outputs (a
    token per patch, and CLS for CLIP), less the first under the 'default' strategy."""
    layout = layout_of(hf_config)
    if layout is ImageLayout.TILED:
        return anyres.max_token_count(hf_config)
    vc = hf_config.vision_config
    if layout is ImageLayout.DYNAMIC:
        return image_processor.size["longest_edge"] // (vc.patch_size * vc.spatial_merge_size) ** 2
    default = getattr(hf_config, "vision_feature_select_strategy", "default") == "default"
    return (vc.image_size // vc.patch_size) ** 2 + (vc.model_type in TOWERS_WITH_CLS) - default


@dataclass
class ProcessedImage:
    pixel_values: "torch.Tensor"
    num_tokens: int
    image_size: tuple[int, int] | None = None  # TILED
    grid_thw: tuple[int, int, int] | None = None  # DYNAMIC
    second_per_grid_t: float | None = None  # Qwen2.5-VL videos: seconds a temporal patch spans


class MultimodalProcessor:
    def __init__(self, hf_config, image_processor, image_token_id: int, image_token: str, vocab_size: int,
                 loader: MediaLoader, video_token_id: int | None = None, video_token: str | None = None,
                 video_processor=None):
        self.hf_config = hf_config
        self.layout = layout_of(hf_config)
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.image_token = image_token  # an image's text in prompts built from text (chat templates, programs)
        self.num_image_tokens = image_token_count(hf_config, image_processor)  # per image (at most, by size)
        self.video_token_id = video_token_id  # None: the model takes no video
        self.video_token = video_token
        self.vocab_size = vocab_size
        self.loader = loader
        # transformers' own video processor where it loads (it needs torchvision); None: frames through the image
        # processor (see preprocess_video).
        self.video_processor = video_processor

    @classmethod
    def for_model(cls, model_dir: str, tokenizer, loader: MediaLoader) -> "MultimodalProcessor | None":
        """The processor of a vision-language model directory; None for a text-only model."""
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            return None
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(model_dir)
        if getattr(hf_config, "vision_config", None) is None:
            return None
        from transformers import AutoImageProcessor  # (after the check: its import costs a text model's start-up ~0.5 s)

        token_id = getattr(hf_config, "image_token_index", None)
        token_id = hf_config.image_token_id if token_id is None else token_id
        image_processor = AutoImageProcessor.from_pretrained(model_dir)
        text = tokenizer.convert_ids_to_tokens
        start, end = getattr(hf_config, "vision_start_token_id", None), getattr(hf_config, "vision_end_token_id", None)
        # Qwen2-VL writes an image as <|vision_start|><|image_pad|><|vision_end|>, a video with <|video_pad|>.
        wrap = (lambda t: text(start) + text(t) + text(end)) if start is not None and end is not None else text
        video_id = hf_config.video_token_id if video_layout_of(hf_config) is not VideoLayout.NONE else None
        if video_id is not None and video_id >= len(tokenizer):
            video_id = None  # the tokenizer has no such token: no prompt can hold a video
        return cls(hf_config, image_processor, token_id, wrap(token_id), hf_config.get_text_config().vocab_size, loader,
                   video_id, None if video_id is None else wrap(video_id),
                   None if video_id is None else load_video_processor(model_dir))

    def max_video_tokens(self) -> int:
        if self.video_token_id is None:
            return 0
        if video_layout_of(self.hf_config) is VideoLayout.POOLED_FRAMES:
            return anyres.video_token_count(DEFAULT_VIDEO_FRAMES, self.hf_config)
        per_frame = self.num_image_tokens
        size = getattr(self.video_processor, "size", None)  # its own pixel cap where it loaded
        if size is not None and getattr(size, "longest_edge", None):
            vc = self.hf_config.vision_config
            per_frame = size.longest_edge // (vc.patch_size * vc.spatial_merge_size) ** 2
        return -(-DEFAULT_VIDEO_FRAMES // self.image_processor.temporal_patch_size) * per_frame

    def preprocess(self, images: list["Image"]) -> list[ProcessedImage]:
        try:
            out = self.image_processor(images=images, return_tensors="pt")
        except Exception as e:  # noqa: BLE001 - the processor's own errors on odd images (sizes, modes)
            raise MediaError(f"the image processor refused the image: {type(e).__name__}: {e}") from None
        pixels = out["pixel_values"].float()
        if self.layout is ImageLayout.FIXED:
            return [ProcessedImage(pv, self.num_image_tokens) for pv in pixels]
        if self.layout is ImageLayout.TILED:
            sizes = [tuple(int(x) for x in s) for s in out["image_sizes"].tolist()]
            if len(images) > 1 and anyres.max_tiles(self.hf_config) is not None:  # OneVision: base views only
                return [ProcessedImage(pv[:1], anyres.single_view_token_count(self.hf_config), s)
                        for pv, s in zip(pixels, sizes)]
            # The batch pads each image's views to the most any image has: keep an image's own.
            return [ProcessedImage(pv[: anyres.num_patches(s, self.hf_config)], anyres.token_count(s, self.hf_config), s)
                    for pv, s in zip(pixels, sizes)]
        grids = [tuple(int(x) for x in g) for g in out["image_grid_thw"].tolist()]
        merge = self.hf_config.vision_config.spatial_merge_size ** 2
        rows = pixels.split([t * h * w for t, h, w in grids])  # the batch's patches, image after image
        return [ProcessedImage(pv, t * h * w // merge, grid_thw=(t, h, w)) for pv, (t, h, w) in zip(rows, grids)]

    def tokens_per_second(self) -> float | None:
        """Qwen2.5-VL: time positions per second of video (None: a video's time positions count temporal patches)."""
        return getattr(self.hf_config.vision_config, "tokens_per_second", None)

    def sample_frames(self, total: int, count: int) -> list[int]:
        """The positions of the frames to take from a video of `total` frames when `count` are asked for, as the
        model's transformers video processor samples them given `num_frames`."""
        if video_layout_of(self.hf_config) is VideoLayout.TEMPORAL_PATCHES:
            return temporal_patch_indices(total, count, self.hf_config.vision_config.temporal_patch_size)
        return even_indices(total, count)

    def preprocess_video(self, frames: list["Image"], frame_interval_s: float | None = None) -> ProcessedImage:
        """The sampled frames through transformers' video processor of the model where it loads, else the fallback:
        Qwen2-VL: each frame through the image processor (which repeats a still image over the temporal patch),
        then consecutive frames stacked into the temporal patches (the last frame repeated to fill the last one);
        LLaVA-OneVision: each frame's base view. Qwen2.5-VL also records the seconds a temporal patch spans (the
        temporal patch size over the sampled frames' rate: the time positions)."""
        import torch

        if self.video_processor is not None:
            return self._with_video_processor(frames, frame_interval_s)
        if video_layout_of(self.hf_config) is VideoLayout.POOLED_FRAMES:
            return self._pooled_frames(frames)
        t_patch, patch = self.image_processor.temporal_patch_size, self.hf_config.vision_config.patch_size
        frames = frames + frames[-1:] * (-len(frames) % t_patch)
        per_frame = self.preprocess(frames)
        _, gh, gw = per_frame[0].grid_thw
        n = gh * gw
        # A frame's patch rows are (C, t_patch, P, P) with every temporal slice equal: keep one.
        x = torch.stack([im.pixel_values.view(n, -1, t_patch, patch, patch)[:, :, 0] for im in per_frame])
        t = len(frames) // t_patch
        x = x.view(t, t_patch, n, -1, patch, patch).permute(0, 2, 3, 1, 4, 5)  # (t, rows, C, t_patch, P, P)
        merge = self.hf_config.vision_config.spatial_merge_size ** 2
        span = t_patch * frame_interval_s if frame_interval_s is not None and self.tokens_per_second() else None
        return ProcessedImage(x.reshape(t * n, -1).contiguous(), t * n // merge, grid_thw=(t, gh, gw),
                              second_per_grid_t=span)

    def _with_video_processor(self, frames: list["Image"], frame_interval_s: float | None) -> ProcessedImage:
        import numpy as np

        video = np.stack([np.asarray(f.convert("RGB")) for f in frames])  # (frames, H, W, 3): one video
        try:  # the frames are already sampled (the loader asked sample_frames)
            out = self.video_processor(videos=[video], do_sample_frames=False, return_tensors="pt")
        except Exception as e:  # noqa: BLE001 - the processor's own errors on odd frames
            raise MediaError(f"the video processor refused the video: {type(e).__name__}: {e}") from None
        pixels = out["pixel_values_videos"].float()
        if video_layout_of(self.hf_config) is VideoLayout.POOLED_FRAMES:
            views = pixels[0].contiguous()  # (frames, C, H, W)
            return ProcessedImage(views, anyres.video_token_count(len(views), self.hf_config))
        t, gh, gw = (int(x) for x in out["video_grid_thw"][0].tolist())
        merge = self.hf_config.vision_config.spatial_merge_size ** 2
        t_patch = self.video_processor.temporal_patch_size
        span = t_patch * frame_interval_s if frame_interval_s is not None and self.tokens_per_second() else None
        return ProcessedImage(pixels.contiguous(), t * gh * gw // merge, grid_thw=(t, gh, gw), second_per_grid_t=span)

    def _pooled_frames(self, frames: list["Image"]) -> ProcessedImage:
        """LLaVA-OneVision: each frame's base view (the frame resized to the tower's input) through the image
        processor; a grid of one tile keeps it from tiling frames it would drop."""
        side = self.hf_config.vision_config.image_size
        try:
            out = self.image_processor(images=frames, image_grid_pinpoints=[[side, side]], return_tensors="pt")
        except Exception as e:  # noqa: BLE001 - the processor's own errors on odd frames
            raise MediaError(f"the image processor refused a video frame: {type(e).__name__}: {e}") from None
        views = out["pixel_values"][:, 0].float().contiguous()
        return ProcessedImage(views, anyres.video_token_count(len(frames), self.hf_config))

    def expand(self, ids: list[int], images: list, videos: list = (), num_frames: int = DEFAULT_VIDEO_FRAMES
               ) -> tuple[list[int], MultimodalInputs]:
        """Loads and preprocesses the media; replaces the k-th image (video) placeholder token of `ids` with the
        k-th image's (video's) pad ids. Raises MediaError (a ValueError) for bad media or placeholder counts that do
        not match."""
        if len(images) + len(videos) > MAX_IMAGES_PER_REQUEST:
            raise MediaError(f"at most {MAX_IMAGES_PER_REQUEST} media items per request, got {len(images) + len(videos)}")
        if videos and self.video_token_id is None:
            raise MediaError("this model does not take videos")
        kinds = {self.image_token_id: (Modality.IMAGE, images, self.image_token)}
        if self.video_token_id is not None:
            kinds[self.video_token_id] = (Modality.VIDEO, videos, self.video_token)
        slots = [i for i, t in enumerate(ids) if t in kinds]
        for token_id, (modality, sources, text) in kinds.items():
            found = sum(ids[i] == token_id for i in slots)
            if found != len(sources):
                raise MediaError(f"the prompt has {found} {modality.value} placeholder(s) ({text}) but "
                                 f"{len(sources)} {modality.value}(s) were given")
        processed = {self.image_token_id: iter(self.preprocess([self.loader.load_image(s) for s in images]))
                     if images else iter(())}
        if videos:
            clips = [self.loader.load_clip(s, num_frames, self.sample_frames) for s in videos]
            processed[self.video_token_id] = iter([self.preprocess_video(c.frames, c.frame_interval_s) for c in clips])
        out, items, prev = [], [], 0
        for slot in slots:
            im = next(processed[ids[slot]])
            out += ids[prev:slot]
            # The frame interval is in the hash: the same frames at another rate take other positions (other KV).
            h = content_hash(im.pixel_values, str((kinds[ids[slot]][0].value, im.image_size, im.grid_thw,
                                                   im.second_per_grid_t)))
            items.append(MultimodalItem(kinds[ids[slot]][0], h, im.pixel_values, len(out), im.num_tokens,
                                        im.image_size, im.grid_thw, im.second_per_grid_t))
            out += pad_ids(h, im.num_tokens, self.vocab_size)
            prev = slot + 1
        out += ids[prev:]
        mm = MultimodalInputs(items)
        if self.layout is ImageLayout.DYNAMIC:
            mm.mrope = mrope_positions(len(out), items, self.hf_config.vision_config.spatial_merge_size,
                                       self.tokens_per_second())
        return out, mm
