"""A tiny random-weight Qwen2-VL checkpoint written with transformers, with a word-level tokenizer (t0 .. t95 and the
vision special tokens) and transformers' own Qwen2-VL image processor; transformers' greedy answers for it."""
from __future__ import annotations

import io

import torch
from transformers import (
    Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
)

from tests.runtime.models.tiny import randomize
from tests.runtime.models.tiny_llava import CHAT_TEMPLATE

VOCAB = 100
VISION_START, IMAGE_PAD, VIDEO_PAD, VISION_END = 96, 97, 98, 99
SPECIAL = {"<|vision_start|>": VISION_START, "<|image_pad|>": IMAGE_PAD, "<|video_pad|>": VIDEO_PAD,
           "<|vision_end|>": VISION_END}
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"  # an image in a prompt
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
PATCH, MERGE = 4, 2


def qwen2_vl_config(v2_5: bool = False) -> Qwen2VLConfig:
    """Qwen2-VL, or Qwen2.5-VL (windowed attention in the vision transformer, its last block global)."""
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    tokens = dict(image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
                  vision_end_token_id=VISION_END)
    if v2_5:
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=4, patch_size=PATCH,
                      spatial_merge_size=MERGE, temporal_patch_size=2, window_size=16, fullatt_block_indexes=[1])
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
        cfg.architectures = ["Qwen2_5_VLForConditionalGeneration"]
        return cfg
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=PATCH,
                  spatial_merge_size=MERGE, temporal_patch_size=2, in_channels=3)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision, **tokens)
    cfg.architectures = ["Qwen2VLForConditionalGeneration"]
    return cfg


def save_tokenizer(path) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(96)} | SPECIAL, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t2")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


def save_tiny_qwen2_vl(path, seed: int = 0, v2_5: bool = False):
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    torch.manual_seed(seed)
    model_cls = Qwen2_5_VLForConditionalGeneration if v2_5 else Qwen2VLForConditionalGeneration
    hf = model_cls(qwen2_vl_config(v2_5)).float()
    randomize(hf, seed)
    with torch.no_grad():  # image rows loud enough that the answer depends on the image
        hf.model.visual.merger.mlp[2].weight.mul_(10.0)
    hf.eval()
    hf.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2,
                             size={"shortest_edge": 8 * 8, "longest_edge": 48 * 48}).save_pretrained(path)
    return hf


def hf_greedy(hf, path, ids: list[int], images: list[bytes], new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and their logprobs for a prompt whose <|image_pad|> tokens are each expanded to an
    image's tokens."""
    from PIL import Image
    from transformers import AutoImageProcessor

    out = AutoImageProcessor.from_pretrained(path)(
        images=[Image.open(io.BytesIO(b)).convert("RGB") for b in images], return_tensors="pt")
    counts = iter((out["image_grid_thw"].prod(-1) // MERGE**2).tolist())
    expanded = [t for tok in ids for t in ([tok] * next(counts) if tok == IMAGE_PAD else [tok])]
    ids_t = torch.tensor([expanded])
    with torch.inference_mode():
        # mm_token_type_ids: without it generate's decode steps do not use the image's M-RoPE positions
        gen = hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), mm_token_type_ids=(ids_t == IMAGE_PAD).int(),
                          pixel_values=out["pixel_values"],
                          image_grid_thw=out["image_grid_thw"], max_new_tokens=new_tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    new = gen.sequences[0, len(expanded):].tolist()
    return new, [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(gen.logits, new)]


def mp4(seed: int, frames: int = 5, size: tuple[int, int] = (40, 32), rate: int = 4) -> bytes:
    """A short MPEG-4 video of random frames (width, height) at `rate` frames per second, written with PyAV."""
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        rng = np.random.default_rng(seed)
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray((rng.random((size[1], size[0], 3)) * 255).astype("uint8"), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def hf_greedy_video(hf, ids: list[int], pixel_values_videos, video_grid_thw, new_tokens: int,
                    second_per_grid_t: float | None = None) -> list[int]:
    """transformers' greedy tokens for a prompt with one video, given its preprocessed patches (transformers' own
    video processor needs torchvision, which radixlm does not install); Qwen2.5-VL: the seconds a temporal patch
    spans."""
    count = int(video_grid_thw.prod()) // MERGE**2
    expanded = [t for tok in ids for t in ([tok] * count if tok == VIDEO_PAD else [tok])]
    ids_t = torch.tensor([expanded])
    with torch.inference_mode():
        gen = hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), mm_token_type_ids=2 * (ids_t == VIDEO_PAD).int(),
                          pixel_values_videos=pixel_values_videos, video_grid_thw=video_grid_thw.view(1, 3),
                          max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                          **({} if second_per_grid_t is None else {"second_per_grid_ts": torch.tensor([second_per_grid_t])}))
    return gen[0, len(expanded):].tolist()
