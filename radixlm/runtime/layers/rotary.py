"""Rotary position embedding: neox (rotate-half) layout as in HF Llama/Qwen, or interleaved pairs (x0, x1), (x2, x3),
... as DeepSeek's MLA rotates its rope dims (GPT-J style; the output stays interleaved, which gives the same dot products
as transformers' DeepSeek-V3 de-interleaving it, since q and k are permuted alike).

The cos/sin cache is computed once in float32 (times YaRN's attention factor, as transformers scales cos and sin) and
indexed by position; q/k are rotated in their own dtype after casting cos/sin to it, which is exactly the reference's
op order."""
from __future__ import annotations

import math

import torch
from torch import nn


def _default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths are divided by `factor`, short ones kept, and the band
    between the two cut-offs interpolated smoothly."""
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    orig_ctx = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = orig_ctx / low
    high_freq_wavelen = orig_ctx / high
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (orig_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, inv_freq: torch.Tensor,
                 interleaved: bool = False, attention_factor: float = 1.0):
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        self.interleaved = interleaved
        self.attention_factor = attention_factor
        # Built on the default device (the loader's target device), so big caches never go through CPU.
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = t[:, None] * inv_freq.to(t.device, torch.float32)[None, :]
        # (max_position, rotary_dim): [cos | sin], each rotary_dim // 2 wide. Not a buffer on purpose:
        # module.to(dtype) must never round it; forward moves it to the positions' device once.
        cos, sin = freqs.cos(), freqs.sin()
        if attention_factor != 1.0:
            cos, sin = cos * attention_factor, sin * attention_factor
        self.cos_sin_cache = torch.cat([cos, sin], dim=-1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (T, heads, head_size); cos/sin: (T, 1, rotary_dim // 2) in x's dtype
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        if self.interleaved:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        else:
            x1, x2 = rot.chunk(2, dim=-1)
            cos2 = torch.cat([cos, cos], dim=-1)
            sin2 = torch.cat([sin, sin], dim=-1)
            out = rot * cos2 + torch.cat([-x2, x1], dim=-1) * sin2
        return out if rest.shape[-1] == 0 else torch.cat([out, rest], dim=-1)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (T,); query: (T, Hq * head_size); key: (T, Hk * head_size)."""
        self.cos_sin_on(positions.device)
        if self.fused(positions, query):
            from radixlm.runtime.kernels.elementwise import rotary_

            rotary_(positions, query, key, self.cos_sin_cache, self.head_size)  # in place, same rounding
            return query, key
        cos_sin = self.cos_sin_cache[positions].to(query.dtype)
        cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)
        q_shape, k_shape = query.shape, key.shape
        # Explicit head counts (not -1) so an empty batch (T == 0) reshapes too.
        q = self._rotate(query.view(q_shape[0], q_shape[-1] // self.head_size, self.head_size), cos, sin)
        k = self._rotate(key.view(k_shape[0], k_shape[-1] // self.head_size, self.head_size), cos, sin)
        return q.reshape(q_shape), k.reshape(k_shape)

    def cos_sin_on(self, device: torch.device) -> torch.Tensor:
        """The cos/sin cache, moved to device (once)."""
        if self.cos_sin_cache.device != device:
            self.cos_sin_cache = self.cos_sin_cache.to(device)
        return self.cos_sin_cache

    def fused(self, positions: torch.Tensor, query: torch.Tensor) -> bool:
        """Whether the rotation is CUDA's one in-place kernel, which can also store the KV (rotate_and_store_)."""
        return (query.is_cuda and not self.interleaved and self.rotary_dim == self.head_size and query.dim() == 2
                and positions.dim() == 1)

    def rotate_and_store_(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          loc: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, scales=None) -> None:
        """forward's rotation in place, with k_buf[loc] = the rotated key and v_buf[loc] = value in the same launch
        (only where fused()); scales: a float8 pool's layer scales (cache.kv_quant.KVScales)."""
        from radixlm.runtime.kernels.elementwise import rotary_

        self.cos_sin_on(positions.device)
        k_scale, v_scale = (scales.k_scale, scales.v_scale) if scales is not None else (1.0, 1.0)
        rotary_(positions, query, key, self.cos_sin_cache, self.head_size, (value, loc, k_buf, v_buf),
                k_scale, v_scale)

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, max_position={self.max_position}, "
                f"interleaved={self.interleaved}, attention_factor={self.attention_factor}")


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched `scale` times (1.0 when not stretched)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(inv_freq: torch.Tensor, rotary_dim: int, base: float, scaling: dict,
          max_position: int) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention factor) of YaRN, as transformers computes them: frequencies whose wavelength exceeds the
    original context are divided by `factor`, those with many turns in it kept, a linear ramp between (beta_fast /
    beta_slow turns); the attention factor is mscale / mscale_all_dim's ratio (DeepSeek) or 0.1 ln(factor) + 1."""
    if not scaling.get("original_max_position_embeddings"):
        raise ValueError(f"yarn rope scaling needs original_max_position_embeddings; got {scaling}")
    orig_ctx = float(scaling["original_max_position_embeddings"])
    factor = float(scaling.get("factor") or max_position / orig_ctx)
    if factor <= 0:
        raise ValueError(f"yarn rope scaling needs a positive factor; got {scaling}")
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(orig_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # no singular ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq, float(attention_factor)


def get_rope(
    head_size: int,
    max_position: int,
    base: float,
    rope_scaling: dict | None = None,
    rotary_dim: int | None = None,
    interleaved: bool = False,
) -> RotaryEmbedding:
    """rope_scaling: an HF `rope_scaling` / `rope_parameters` dict, or None. Supported rope types:
    default, linear, llama3, yarn (with DeepSeek's mscale / mscale_all_dim)."""
    rotary_dim = rotary_dim or head_size
    inv_freq = _default_inv_freq(rotary_dim, base)
    attention_factor = 1.0
    rope_type = "default"
    if rope_scaling:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope_scaling)
    elif rope_type == "linear":
        inv_freq = inv_freq / float(rope_scaling["factor"])
    elif rope_type in ("yarn", "deepseek_yarn"):
        inv_freq, attention_factor = _yarn(inv_freq, rotary_dim, base, rope_scaling, max_position)
    elif rope_type != "default":
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: default, linear, llama3, yarn")
    return RotaryEmbedding(head_size, rotary_dim, max_position, inv_freq, interleaved, attention_factor)


def rope_params_from_config(config) -> tuple[float, dict | None]:
    """(rope_theta, scaling dict or None), for both transformers 5 (`rope_parameters`) and 4.x
    (`rope_theta` + `rope_scaling`) configs."""
    params = getattr(config, "rope_parameters", None) or {}
    if params and not isinstance(params.get("rope_theta", 0.0), (int, float)):
        raise ValueError("per-layer rope parameters are not supported")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    scaling = getattr(config, "rope_scaling", None) or params or None
    return float(theta), scaling
