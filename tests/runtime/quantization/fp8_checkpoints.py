"""FP8 checkpoints written from the formats' specifications (SGLang / vLLM `fp8` and `w8a8_fp8`): e4m3 weights with
a scale per tensor (`weight_scale`, shape ()), per output channel (`weight_scale` (N, 1)) or per bn x bk block
(`weight_scale_inv` (ceil(N / bn), ceil(K / bk))), and static `input_scale`s; the dequantized weight is computed here
(q * scale, broadcast by hand), not by radixlm's kernels.quant."""
from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def _to_fp8(w: torch.Tensor, scale_full: torch.Tensor) -> torch.Tensor:
    return (w / scale_full).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def per_tensor(name: str, w: torch.Tensor, static: bool = False):
    scale = w.abs().max() / E4M3_MAX * 1.07  # not the tight scale: radixlm must use the stored one
    q = _to_fp8(w, scale)
    parts = {"weight": q, "weight_scale": scale.reshape(())}
    if static:
        parts["input_scale"] = torch.tensor(0.0123 + 0.001 * (len(name) % 5))
    return parts, q.float() * scale


def per_channel(name: str, w: torch.Tensor):
    scale = w.abs().amax(dim=1, keepdim=True) / E4M3_MAX
    q = _to_fp8(w, scale)
    return {"weight": q, "weight_scale": scale}, q.float() * scale


def block(bn: int, bk: int, scale_name: str = "weight_scale_inv"):
    def quantize(name: str, w: torch.Tensor):
        n, k = w.shape
        nb, kb = -(-n // bn), -(-k // bk)
        scale = torch.empty(nb, kb)
        for i in range(nb):
            for j in range(kb):
                scale[i, j] = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].abs().max() / E4M3_MAX
        full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        q = _to_fp8(w, full)
        return {"weight": q, scale_name: scale}, q.float() * full

    return quantize
