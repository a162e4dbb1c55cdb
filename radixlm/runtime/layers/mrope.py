"""Multimodal rotary embedding (Qwen2-VL's M-RoPE): each token has three positions (time, height, width); the rotary
frequencies are split into `mrope_section` bands, band i rotated by position axis i % 3. A text token's three positions
are equal, which is plain RoPE: 1-D positions take the plain path."""
from __future__ import annotations

import torch

from radixlm.runtime.layers.rotary import RotaryEmbedding, _default_inv_freq


class MRotaryEmbedding(RotaryEmbedding):
    def __init__(self, head_size: int, max_position: int, base: float, mrope_section: list[int]):
        super().__init__(head_size, head_size, max_position, _default_inv_freq(head_size, base))
        if sum(mrope_section) != head_size // 2:
            raise ValueError(f"mrope_section {mrope_section} must sum to head_dim / 2 = {head_size // 2}")
        self.mrope_section = list(mrope_section)

    def _bands(self, table: torch.Tensor) -> torch.Tensor:
        """(3, T, rotary_dim // 2) -> (T, rotary_dim // 2): band i from axis i % 3."""
        return torch.cat([band[i % 3] for i, band in enumerate(table.split(self.mrope_section, dim=-1))], dim=-1)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """positions: (T,) or (3, T)."""
        if positions.dim() == 1:
            return super().forward(positions, query, key)
        self.cos_sin_on(positions.device)
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        cos = self._bands(cos).to(query.dtype).unsqueeze(1)
        sin = self._bands(sin).to(query.dtype).unsqueeze(1)
        q_shape, k_shape = query.shape, key.shape
        q = self._rotate(query.view(q_shape[0], q_shape[-1] // self.head_size, self.head_size), cos, sin)
        k = self._rotate(key.view(k_shape[0], k_shape[-1] // self.head_size, self.head_size), cos, sin)
        return q.reshape(q_shape), k.reshape(k_shape)
