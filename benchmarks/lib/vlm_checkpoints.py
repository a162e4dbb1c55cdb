"""Model directories for the vision-language benchmarks, written with transformers: a tiny random-weight Qwen2-VL
(weights saved, CPU-sized) and the published shapes of Qwen2.5-VL-7B-Instruct and LLaVA-OneVision-7B (config only:
run with --load-format dummy). Each gets a word-level tokenizer over the model's real vocabulary size (t0, t1, ...
with the vision special tokens at their real ids), a plain chat template and transformers' own image processor."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

import torch

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}t1 {% endif %}")


class VlmShape(str, enum.Enum):
    TINY_QWEN2_VL = "tiny-qwen2-vl"
    QWEN2_5_VL_7B = "qwen2.5-vl-7b"
    LLAVA_ONEVISION_7B = "llava-onevision-7b"


@dataclass(frozen=True)
class VlmCheckpoint:
    path: Path
    shape: VlmShape
    vocab_size: int  # words t0 .. t{n-1} below the special tokens
    has_weights: bool  # False: config only (--load-format dummy)


def _tokenizer(path: Path, vocab_size: int, special: dict[str, int]) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(min(special.values()))}
    tok = Tokenizer(models.WordLevel(words | special, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in special])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t2")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


QWEN_SPECIAL = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


def _qwen_vl(path: Path, shape: VlmShape, seed: int) -> VlmCheckpoint:
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tiny = shape is VlmShape.TINY_QWEN2_VL
    # Qwen's ids: <|vision_start|> 151652 .. <|video_pad|> 151656; the tiny model puts them right after its words.
    first = 480 if tiny else 151652
    special = {t: first + i for i, t in enumerate(QWEN_SPECIAL)}
    tokens = dict(vision_start_token_id=first, vision_end_token_id=first + 1, image_token_id=first + 3,
                  video_token_id=first + 4)
    if tiny:
        text = dict(vocab_size=512, bos_token_id=1, eos_token_id=2, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=4096,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]})
        vision = dict(depth=4, embed_dim=64, hidden_size=128, num_heads=4, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
        cfg = Qwen2VLConfig(text_config=text, vision_config=vision, bos_token_id=1, eos_token_id=2, **tokens)
        cfg.architectures = ["Qwen2VLForConditionalGeneration"]
        max_pixels = 448 * 448
    else:
        text = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                    num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})
        vision = dict(depth=32, hidden_size=1280, out_hidden_size=3584, intermediate_size=3420, num_heads=16,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                      fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu", tokens_per_second=2)
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
        cfg.architectures = ["Qwen2_5_VLForConditionalGeneration"]
        max_pixels = 12845056
    if tiny:
        torch.manual_seed(seed)
        hf = Qwen2VLForConditionalGeneration(cfg).float().eval()
        hf.save_pretrained(path, safe_serialization=True)
    else:
        cfg.save_pretrained(path)
    _tokenizer(path, first, special)
    Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2,
                             size={"shortest_edge": 56 * 56, "longest_edge": max_pixels}).save_pretrained(path)
    return VlmCheckpoint(path, shape, first, tiny)


def _llava_onevision_7b(path: Path) -> VlmCheckpoint:
    from transformers import LlavaOnevisionConfig, Qwen2Config, SiglipVisionConfig
    from transformers.models.llava_onevision import LlavaOnevisionImageProcessorPil

    image_token, video_token = 151646, 151647
    text = Qwen2Config(vocab_size=152128, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1e6, rms_norm_eps=1e-6)
    vision = SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=26,
                                num_attention_heads=16, image_size=384, patch_size=14)
    pinpoints = [[384 * i, 384 * j] for i in range(1, 7) for j in range(1, 7)]
    cfg = LlavaOnevisionConfig(vision_config=vision, text_config=text, image_token_index=image_token,
                               video_token_index=video_token, image_grid_pinpoints=pinpoints,
                               vision_aspect_ratio="anyres_max_9", vision_feature_select_strategy="full",
                               vision_feature_layer=-1)
    cfg.architectures = ["LlavaOnevisionForConditionalGeneration"]
    cfg.save_pretrained(path)
    _tokenizer(path, image_token, {"<image>": image_token, "<video>": video_token})
    LlavaOnevisionImageProcessorPil(size={"height": 384, "width": 384}, image_grid_pinpoints=pinpoints,
                                    image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(path)
    return VlmCheckpoint(path, VlmShape.LLAVA_ONEVISION_7B, image_token, False)


def write_checkpoint(shape: VlmShape, path: Path, seed: int = 0) -> VlmCheckpoint:
    path.mkdir(parents=True, exist_ok=True)
    if shape is VlmShape.LLAVA_ONEVISION_7B:
        return _llava_onevision_7b(path)
    return _qwen_vl(path, shape, seed)
