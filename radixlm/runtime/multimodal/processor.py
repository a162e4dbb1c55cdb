"""The front's half of multimodal requests: images through the model's own transformers image processor, each hashed,
and the prompt's image placeholder token expanded to the image's token count, holding the image's pad ids."""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from radixlm.runtime.multimodal import anyres
from radixlm.runtime.multimodal.inputs import Modality, MultimodalInputs, MultimodalItem, content_hash, pad_ids
from radixlm.runtime.multimodal.media import MediaError, MediaLoader

if TYPE_CHECKING:
    from PIL.Image import Image

logger = logging.getLogger(__name__)

MAX_IMAGES_PER_REQUEST = 64


# Vision towers whose output starts with a CLS token (SigLIP's does not).
TOWERS_WITH_CLS = ("clip_vision_model",)


def image_token_count(hf_config) -> int:
    """LLaVA-1.5: the tower's outputs (a token per patch, and CLS for CLIP), less the first under the 'default'
    strategy; LLaVA-NeXT: the most an image can take (its own count depends on its size)."""
    if getattr(hf_config, "image_grid_pinpoints", None):
        return anyres.max_token_count(hf_config)
    vc = hf_config.vision_config
    default = getattr(hf_config, "vision_feature_select_strategy", "default") == "default"
    return (vc.image_size // vc.patch_size) ** 2 + (vc.model_type in TOWERS_WITH_CLS) - default


class MultimodalProcessor:
    def __init__(self, hf_config, image_processor, image_token_id: int, image_token: str, vocab_size: int,
                 loader: MediaLoader):
        self.hf_config = hf_config
        self.anyres = bool(getattr(hf_config, "image_grid_pinpoints", None))  # LLaVA-NeXT tiling
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.image_token = image_token  # the placeholder's text, for prompts built from text (chat templates, programs)
        self.num_image_tokens = image_token_count(hf_config)  # per image (at most, with tiling)
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
        token_id = hf_config.image_token_index
        image_processor = AutoImageProcessor.from_pretrained(model_dir)
        token = tokenizer.convert_ids_to_tokens(token_id)
        return cls(hf_config, image_processor, token_id, token, hf_config.get_text_config().vocab_size, loader)

    def preprocess(self, images: list["Image"]) -> list[tuple]:
        """(pixel values, image size or None, token count) per image."""
        try:
            out = self.image_processor(images=images, return_tensors="pt")
        except Exception as e:  # noqa: BLE001 - the processor's own errors on odd images (sizes, modes)
            raise MediaError(f"the image processor refused the image: {type(e).__name__}: {e}") from None
        pixels = out["pixel_values"].float()
        if not self.anyres:
            return [(pv, None, self.num_image_tokens) for pv in pixels]
        sizes = [tuple(int(x) for x in s) for s in out["image_sizes"].tolist()]
        # The batch pads each image's views to the most any image has: keep an image's own.
        return [(pv[: anyres.num_patches(s, self.hf_config)], s, anyres.token_count(s, self.hf_config))
                for pv, s in zip(pixels, sizes)]

    def expand(self, ids: list[int], sources: list) -> tuple[list[int], MultimodalInputs]:
        """Loads and preprocesses the images; replaces the k-th placeholder token of `ids` with the k-th image's pad
        ids. Raises MediaError (a ValueError) for bad media or a placeholder count that does not match."""
        if len(sources) > MAX_IMAGES_PER_REQUEST:
            raise MediaError(f"at most {MAX_IMAGES_PER_REQUEST} images per request, got {len(sources)}")
        slots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(slots) != len(sources):
            raise MediaError(f"the prompt has {len(slots)} image placeholder(s) ({self.image_token}) but "
                             f"{len(sources)} image(s) were given")
        pixels = self.preprocess([self.loader.load_image(s) for s in sources])
        out, items, prev = [], [], 0
        for slot, (pv, size, n) in zip(slots, pixels):
            out += ids[prev:slot]
            h = content_hash(pv, str(size))
            items.append(MultimodalItem(Modality.IMAGE, h, pv, len(out), n, size))
            out += pad_ids(h, n, self.vocab_size)
            prev = slot + 1
        out += ids[prev:]
        return out, MultimodalInputs(items)
