"""A tiny random-weight LLaVA-1.5 checkpoint written with transformers (CLIP tower, Llama or Qwen2 language model),
saved with a word-level tokenizer (t0 .. t{n-2}, and <image> as the last id), a chat template and transformers' own
CLIP image processor; transformers' greedy answers for it; test images as PNG bytes."""
from __future__ import annotations

import io

import numpy as np
import torch
from transformers import (
    CLIPVisionConfig, SiglipVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaNextConfig,
    LlavaNextForConditionalGeneration, Qwen2Config,
)

from tests.runtime.models.tiny import randomize

VOCAB = 96
IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = VOCAB - 1
IMAGE_SIZE, PATCH = 28, 7
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # the 'default' strategy drops CLS
GRID_PINPOINTS = [[28, 56], [56, 28], [56, 56], [28, 84]]  # LLaVA-NeXT: tile grids of 1x2, 2x1, 2x2, 1x3
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}t1 {% endif %}")


def llava_config(text: str = "llama", next_: bool = False, tower: str = "clip") -> LlavaConfig:
    """tower: clip, or siglip (no CLS token; the 'full' feature strategy, as LLaVA-OneVision)."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024)
    text_config = LlamaConfig(**common) if text == "llama" else Qwen2Config(**common)
    vision_cls = SiglipVisionConfig if tower == "siglip" else CLIPVisionConfig
    vision = vision_cls(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                        image_size=IMAGE_SIZE, patch_size=PATCH)
    if next_:
        cfg = LlavaNextConfig(vision_config=vision, text_config=text_config, image_token_index=IMAGE_TOKEN_ID,
                              image_grid_pinpoints=GRID_PINPOINTS)
        cfg.architectures = ["LlavaNextForConditionalGeneration"]
        return cfg
    cfg = LlavaConfig(vision_config=vision, text_config=text_config, image_token_index=IMAGE_TOKEN_ID,
                      vision_feature_select_strategy="full" if tower == "siglip" else "default")
    cfg.architectures = ["LlavaForConditionalGeneration"]
    return cfg


def save_tokenizer(path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {IMAGE_TOKEN: IMAGE_TOKEN_ID}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t2")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


def save_tiny_llava(path, text: str = "llama", seed: int = 0, next_: bool = False, tower: str = "clip"):
    """Writes the checkpoint, tokenizer and image processor to path; returns transformers' model (float32, eval).
    next_: LLaVA-NeXT (any-resolution tiling) instead of LLaVA-1.5."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    torch.manual_seed(seed)
    model_cls = LlavaNextForConditionalGeneration if next_ else LlavaForConditionalGeneration
    hf = model_cls(llava_config(text, next_, tower)).float()
    randomize(hf, seed)
    with torch.no_grad():  # image rows loud enough that the answer depends on the image
        hf.model.multi_modal_projector.linear_2.weight.mul_(10.0)
    hf.eval()
    hf.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    sizes = dict(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    if next_:
        LlavaNextImageProcessorPil(image_grid_pinpoints=GRID_PINPOINTS, **sizes).save_pretrained(path)
    else:
        CLIPImageProcessorPil(**sizes).save_pretrained(path)
    return hf


def png(seed: int, size: tuple[int, int] = (40, 34)) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def hf_greedy_with_image(hf, path, ids: list[int], images: list[bytes], new_tokens: int) -> list[int]:
    """transformers' greedy tokens for a prompt whose <image> tokens are each expanded to an image's tokens."""
    from PIL import Image
    from transformers import AutoImageProcessor

    processed = AutoImageProcessor.from_pretrained(path)(
        images=[Image.open(io.BytesIO(b)).convert("RGB") for b in images], return_tensors="pt")
    extra = {"image_sizes": processed["image_sizes"]} if "image_sizes" in processed else {}
    with torch.inference_mode():
        if extra:  # LLaVA-NeXT: each image's token count is transformers' own packed feature length
            feats = hf.model.get_image_features(processed["pixel_values"], **extra).pooler_output
            counts = iter([f.shape[0] for f in feats])
        else:  # LLaVA-1.5: the tower's output rows (SigLIP under 'full' has as many as CLIP under 'default')
            counts = iter([NUM_IMAGE_TOKENS] * len(images))
        expanded = [t for tok in ids for t in ([tok] * next(counts) if tok == IMAGE_TOKEN_ID else [tok])]
        ids_t = torch.tensor([expanded])  # an explicit mask: generate would take t0 (the pad id) for padding
        out = hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), pixel_values=processed["pixel_values"],
                          max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0, **extra)
    return out[0, len(expanded):].tolist()
