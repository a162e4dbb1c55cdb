"""The KV cache's storage format (--kv-cache-dtype): the model's dtype (auto), or float8 (e4m3 / e5m2) with one K and
one V scale per layer. A float8 pool stores x / scale saturated to the format's largest finite value and reads
stored * scale; the torch functions here are the CPU path and the reference of the CUDA kernels' store and load."""
from __future__ import annotations

from dataclasses import dataclass

import torch

# SGLang's spellings of --kv-cache-dtype (args.choices.KVCacheDtype) -> the pool's element type.
FP8_KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def kv_cache_torch_dtype(kv_cache_dtype: object, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's dtype for a --kv-cache-dtype value (a KVCacheDtype or its string): auto is the model's dtype."""
    name = getattr(kv_cache_dtype, "value", kv_cache_dtype)
    if name == "auto":
        return model_dtype
    if name not in FP8_KV_DTYPES:
        choices = ", ".join(map(repr, ("auto", *FP8_KV_DTYPES)))
        raise ValueError(f"unknown kv_cache_dtype {name!r}; choose from ({choices})")
    return FP8_KV_DTYPES[name]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_KV_DTYPES.values()


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


@dataclass(frozen=True)
class KVScales:
    """One layer's scales: the stored K is k / k_scale, the stored V is v / v_scale (1.0 where nothing set them)."""

    k_scale: float = 1.0
    v_scale: float = 1.0


def quantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x as a pool of `dtype` stores it: a cast, or for float8 x / scale (float32) saturated, then cast."""
    if not is_fp8(dtype):
        return x.to(dtype)
    limit = fp8_max(dtype)
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def dequantize_kv(stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Stored values in `dtype` (a float8 pool's times its scale)."""
    out = stored.to(dtype)
    return out.mul_(scale) if is_fp8(stored.dtype) and scale != 1.0 else out


def e4m3_query_rows(q: torch.Tensor) -> torch.Tensor:
    """The CUDA decode kernel's FP8 query over an e4m3 pool (kernels/attention/decode.fp8_query), in float32: each row
    (last dimension: a request's head) rounded to e4m3 at its own scale, amax / 448, and read back at that scale."""
    rows = q.float()
    scale = rows.abs().amax(-1, keepdim=True).clamp_min(1e-30) / fp8_max(torch.float8_e4m3fn)
    return (rows / scale).to(torch.float8_e4m3fn).float() * scale
