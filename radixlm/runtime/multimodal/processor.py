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
from radixlm.runtime.multimodal.media import MediaError, MediaLoader

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

logger = logging.getLogger(__name__)

MAX_IMAGES_PER_REQUEST = 64


# Vision towers whose output starts with a CLS token (SigLIP's does not).
TOWERS_WITH_CLS = ("clip_vision_model",)


class ImageLayout(str, enum.Enum):
    """How a model turns an image into tokens."""

    FIXED = "fixed"  # LLaVA-1.5: one view at the tower's resolution, a token per patch
    TILED = "tiled"  # LLaVA-NeXT: the base view and the tiles of a grid that suits the image (anyres)
    DYNAMIC = "dynamic"  # Qwen2-VL: patches at the image's own (resized) resolution, merged; M-RoPE positions


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


class MultimodalProcessor:
    def __init__(self, hf_config, image_processor, image_token_id: int, image_token: str, vocab_size: int,
                 loader: MediaLoader):
        self.hf_config = hf_config
        self.layout = layout_of(hf_config)
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.image_token = image_token  # an image's text in prompts built from text (chat templates, programs)
        self.num_image_tokens = image_token_count(hf_config, image_processor)  # per image (at most, by size)
        self.vocab_size = vocab_size
        self.loader = loader

    @classmethod
    def for_model(cls, model_dir: str, tokenizer, loader: MediaLoader) -> "MultimodalProcessor | None":
        """The processor of a vision-language model directory; None for a text-only model."""
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            return None
        from transformers import AutoConfig, AutoImageProcessor

        hf_config = AutoConfig.from_pretrained(model_dir)
        if getattr(hf_config, "vision_config", None) is None:
            return None
        token_id = getattr(hf_config, "image_token_index", None)
        token_id = hf_config.image_token_id if token_id is None else token_id
        image_processor = AutoImageProcessor.from_pretrained(model_dir)
        token = tokenizer.convert_ids_to_tokens(token_id)
        start, end = getattr(hf_config, "vision_start_token_id", None), getattr(hf_config, "vision_end_token_id", None)
        if start is not None and end is not None:  # Qwen2-VL writes an image as <|vision_start|><|image_pad|><|vision_end|>
            token = tokenizer.convert_ids_to_tokens(start) + token + tokenizer.convert_ids_to_tokens(end)
        return cls(hf_config, image_processor, token_id, token, hf_config.get_text_config().vocab_size, loader)

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
            # The batch pads each image's views to the most any image has: keep an image's own.
            return [ProcessedImage(pv[: anyres.num_patches(s, self.hf_config)], anyres.token_count(s, self.hf_config), s)
                    for pv, s in zip(pixels, sizes)]
        grids = [tuple(int(x) for x in g) for g in out["image_grid_thw"].tolist()]
        merge = self.hf_config.vision_config.spatial_merge_size ** 2
        rows = pixels.split([t * h * w for t, h, w in grids])  # the batch's patches, image after image
        return [ProcessedImage(pv, t * h * w // merge, grid_thw=(t, h, w)) for pv, (t, h, w) in zip(rows, grids)]

    def expand(self, ids: list[int], sources: list) -> tuple[list[int], MultimodalInputs]:
        """Loads and preprocesses the images; replaces the k-th placeholder token of `ids` with the k-th image's pad
        ids. Raises MediaError (a ValueError) for bad media or a placeholder count that does not match."""
        if len(sources) > MAX_IMAGES_PER_REQUEST:
            raise MediaError(f"at most {MAX_IMAGES_PER_REQUEST} images per request, got {len(sources)}")
        slots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(slots) != len(sources):
            raise MediaError(f"the prompt has {len(slots)} image placeholder(s) ({self.image_token}) but "
                             f"{len(sources)} image(s) were given")
        images = self.preprocess([self.loader.load_image(s) for s in sources])
        out, items, prev = [], [], 0
        for slot, im in zip(slots, images):
            out += ids[prev:slot]
            h = content_hash(im.pixel_values, str((im.image_size, im.grid_thw)))
            items.append(MultimodalItem(Modality.IMAGE, h, im.pixel_values, len(out), im.num_tokens, im.image_size,
                                        im.grid_thw))
            out += pad_ids(h, im.num_tokens, self.vocab_size)
            prev = slot + 1
        out += ids[prev:]
        mm = MultimodalInputs(items)
        if self.layout is ImageLayout.DYNAMIC:
            mm.mrope = mrope_positions(len(out), items, self.hf_config.vision_config.spatial_merge_size)
        return out, mm
