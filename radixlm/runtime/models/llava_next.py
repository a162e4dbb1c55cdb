"""LLaVA-NeXT (1.6) and LLaVA-OneVision: LLaVA with any-resolution tiling. Each image is encoded as its base view plus grid tiles; the tiles'
features are stitched, unpadded and closed row by row with the learned `image_newline` (runtime/multimodal/anyres.py
holds the layout the front counts tokens with)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.models.llava import LlavaForConditionalGeneration
from radixlm.runtime.multimodal import anyres
from radixlm.runtime.multimodal.inputs import Modality

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.multimodal.inputs import MultimodalItem


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__(config, parallel)
        self.image_newline = nn.Parameter(torch.empty(config.text_config.hidden_size))

    @torch.no_grad()
    def encode_items(self, items: list["MultimodalItem"]) -> list[torch.Tensor]:
        projected = self._features(torch.cat([it.pixel_values for it in items]))
        return [self._pack_item(p, it) for p, it in zip(projected.split([len(it.pixel_values) for it in items]), items)]

    def _pack_item(self, feats: torch.Tensor, item: "MultimodalItem") -> torch.Tensor:
        return self._pack(feats, item.image_size)

    def _pack(self, feats: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """(views, side * side, hidden) -> (tokens, hidden): the base view's rows, then the unpadded tile map row by
        row, each row closed by image_newline (an image of the base view alone: its rows and one newline)."""
        side = anyres.tile_side(self.config)
        base, tiles = feats[0], feats[1:]
        if not len(tiles):
            return torch.cat([base, self.image_newline.to(base.dtype)[None]])
        rows, cols = anyres.grid_shape(image_size, self.config)
        hidden = feats.shape[-1]
        # (rows, cols, side, side, hidden) -> (hidden, rows * side, cols * side): tiles stitched into one map
        grid = tiles.reshape(rows, cols, side, side, hidden).permute(4, 0, 2, 1, 3).reshape(hidden, rows * side,
                                                                                             cols * side)
        grid = anyres.unpad(grid, image_size)
        capped = anyres.capped_shape(grid.shape[1], grid.shape[2], self.config)
        if capped != tuple(grid.shape[1:]):
            grid = nn.functional.interpolate(grid[None], list(capped), mode="bilinear")[0]
        newline = self.image_newline.to(grid.dtype)[:, None, None].expand(hidden, grid.shape[1], 1)
        grid = torch.cat([grid, newline], dim=2).flatten(1).transpose(0, 1)
        return torch.cat([base, grid])

    def _our_name(self, name: str, params: dict[str, nn.Parameter]) -> str:
        return "image_newline" if name == "model.image_newline" else super()._our_name(name, params)


class LlavaOnevisionForConditionalGeneration(LlavaNextForConditionalGeneration):
    """LLaVA-OneVision: LLaVA-NeXT's tiling with the tile map capped (anyres_max_9), a SigLIP tower and Qwen2; several
    images in one prompt are encoded as their base views alone; a video's frames as base views whose feature maps are
    pooled 2x2 (bilinearly), frame after frame, and one newline after the last."""

    def _pack_item(self, feats: torch.Tensor, item: "MultimodalItem") -> torch.Tensor:
        if item.modality is not Modality.VIDEO:
            return super()._pack_item(feats, item)
        side, pooled = anyres.tile_side(self.config), anyres.pooled_side(self.config)
        grid = feats.reshape(len(feats), side, side, -1).permute(0, 3, 1, 2)
        grid = nn.functional.interpolate(grid, size=[pooled, pooled], mode="bilinear")
        rows = grid.permute(0, 2, 3, 1).reshape(-1, feats.shape[-1])
        return torch.cat([rows, self.image_newline.to(rows.dtype)[None]])
