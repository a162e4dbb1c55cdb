"""A checkpoint's FP8 KV-cache scales, routed to the layer's RadixAttention (k_scale / v_scale, read by the KV pool
when --kv-cache-dtype is fp8_*). The spellings vLLM and SGLang load: `<layer>.self_attn.k_scale` / `v_scale`
(compressed-tensors, llm-compressor), the same under `k_proj` / `v_proj` / `qkv_proj` (ModelOpt) or `attn`, and
older FP8 checkpoints' one `kv_scale` for both."""
from __future__ import annotations

import math
import re

import torch
from torch import nn

_KV_SCALE = re.compile(r"^(?P<attn>.*\.self_attn)\.(?:(?:k_proj|v_proj|qkv_proj|attn)\.)?(?P<which>k|v|kv)_scale$")


def kv_scale_target(name: str) -> tuple[str, tuple[str, ...]] | None:
    """(the attention module's path, the RadixAttention attributes the tensor sets) for a KV-scale tensor's name;
    None for any other tensor."""
    m = _KV_SCALE.match(name)
    if m is None:
        return None
    which = m.group("which")
    return m.group("attn"), ("k_scale", "v_scale") if which == "kv" else (f"{which}_scale",)


def load_kv_scale(model: nn.Module, name: str, tensor) -> bool:
    """Sets the scale a KV-scale tensor names on its layer's RadixAttention (`<attn path>.attn`); False for other
    tensors. A per-head or per-channel scale, a non-finite or non-positive one, or one of a layer the model does not
    have is refused with the tensor's name."""
    target = kv_scale_target(name)
    if target is None:
        return False
    path, attrs = target
    try:
        radix = model.get_submodule(f"{path}.attn")
    except AttributeError:
        raise ValueError(f"{name}: a KV cache scale of a layer {type(model).__name__} does not have") from None
    value = tensor[...] if not isinstance(tensor, torch.Tensor) else tensor
    if value.numel() != 1:
        raise ValueError(f"{name}: only per-tensor KV cache scales are supported (shape {tuple(value.shape)})")
    scale = float(value.float().reshape(()))
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{name}: a KV cache scale must be finite and > 0, got {scale}")
    for attr in attrs:
        setattr(radix, attr, scale)
    return True
