"""A tiny random-weight LLaVA-1.5 checkpoint written with transformers (CLIP tower, Llama or Qwen2 language model),
saved with a word-level tokenizer (t0 .. t{n-2}, and <image> as the last id), a chat template and transformers' own
CLIP image processor; transformers' greedy answers for it; test images as PNG bytes."""
from __future__ import annotations

import io

import numpy as np
import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

from tests.runtime.models.tiny import randomize

VOCAB = 96
IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = VOCAB - 1
IMAGE_SIZE, PATCH = 28, 7
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # the 'default' strategy drops CLS
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}t1 {% endif %}")


def llava_config(text: str = "llama") -> LlavaConfig:
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
    text_config = LlamaConfig(**common) if text == "llama" else Qwen2Config(**common)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              image_size=IMAGE_SIZE, patch_size=PATCH)
    cfg = LlavaConfig(vision_config=vision, text_config=text_config, image_token_index=IMAGE_TOKEN_ID)
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


def save_tiny_llava(path, text: str = "llama", seed: int = 0) -> LlavaForConditionalGeneration:
    """Writes the checkpoint, tokenizer and image processor to path; returns transformers' model (float32, eval)."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    torch.manual_seed(seed)
    hf = LlavaForConditionalGeneration(llava_config(text)).float()
    randomize(hf, seed)
    with torch.no_grad():  # image rows loud enough that the answer depends on the image
        hf.model.multi_modal_projector.linear_2.weight.mul_(10.0)
    hf.eval()
    hf.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                          crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(path)
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

    expanded = [t for tok in ids for t in ([tok] * NUM_IMAGE_TOKENS if tok == IMAGE_TOKEN_ID else [tok])]
    pixels = AutoImageProcessor.from_pretrained(path)(
        images=[Image.open(io.BytesIO(b)).convert("RGB") for b in images], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        ids_t = torch.tensor([expanded])  # an explicit mask: generate would take t0 (the pad id) for padding
        out = hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), pixel_values=pixels, max_new_tokens=new_tokens,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(expanded):].tolist()
