"""oneDNN-prepacked float32 GEMM for CPU inference.

On x86 CPUs (markedly on AMD, where the default BLAS takes a generic path) oneDNN's prepacked sgemm runs
2-3x faster for the matrix shapes of prefill and decode. The packed copy is made once after loading and is then the
layer's only copy: its parameter keeps its shape and dtype over a one-element placeholder (`placeholder`), which any
in-place write refuses, until `unpack` restores it (weight updates, the memory saver). Anything unsupported (other
dtypes, devices, torch builds) is not packed and runs F.linear."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

# oneDNN picks its packed layout for this many rows; other row counts still work.
PACK_ROWS_HINT = 64


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)
    except (AttributeError, RuntimeError) as e:
        logger.debug("oneDNN weight packing unavailable: %s", e)
        return None


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The plain (out, in) weight a packed one was made from, bit for bit."""
    return packed.to_dense()


def placeholder(like: torch.Tensor) -> torch.Tensor:
    """like's shape, dtype and device over one NaN: a read gives NaN, an in-place write raises (every element is the
    same memory)."""
    return torch.full((1,), float("nan"), dtype=like.dtype, device=like.device).expand(like.shape)


def is_placeholder(weight: torch.Tensor) -> bool:
    return weight.numel() > 1 and weight.untyped_storage().nbytes() == weight.element_size()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None) -> torch.Tensor:
    if packed is None:
        return F.linear(x, weight, bias)
    if x.dtype != torch.float32:
        raise TypeError(f"a packed float32 weight takes float32 inputs, not {x.dtype}")
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
