"""LLaVA-NeXT any-resolution layout: an image is the base view plus the tiles of the grid resolution that suits it best;
the tiles' features are stitched into one map, the padding the resize added is cut off, and a newline embedding ends
each row. The front needs the token count before any encoder runs, the model the same layout: both come from here,
built on transformers' own grid and unpadding functions, so the count always equals the packed features' rows."""
from __future__ import annotations

import math

import torch


def _hf():
    from transformers.models.llava_next import modeling_llava_next

    return modeling_llava_next


def tile_side(config) -> int:
    """Feature rows (= columns) of one tile."""
    return config.vision_config.image_size // config.vision_config.patch_size


def num_patches(image_size: tuple[int, int], config) -> int:
    """Views the tower encodes for an image of (height, width): the base view and the tiles."""
    return _hf().image_size_to_num_patches(list(image_size), config.image_grid_pinpoints, config.vision_config.image_size)


def grid_shape(image_size: tuple[int, int], config) -> tuple[int, int]:
    """(tiles down, tiles across)."""
    return tuple(_hf().get_anyres_image_grid_shape(list(image_size), config.image_grid_pinpoints,
                                                   config.vision_config.image_size))


def unpad(feature_map: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """(C, H, W) stitched tile features -> the part covering the image (the resize's padding removed)."""
    return _hf().unpad_image(feature_map, list(image_size))


def max_tiles(config) -> int | None:
    """LLaVA-OneVision's cap ('anyres_max_9': the stitched map is shrunk to about 9 tiles' worth); None: no cap."""
    ratio = getattr(config, "vision_aspect_ratio", None)
    return int(ratio[len("anyres_max_"):]) if ratio and ratio.startswith("anyres_max_") else None


def capped_shape(height: int, width: int, config) -> tuple[int, int]:
    """The unpadded map's (rows, columns) after the cap: shrunk (bilinearly, by the model) when over 1.1x of it."""
    cap = max_tiles(config)
    if cap is None:
        return height, width
    ratio = math.sqrt(height * width / (cap * tile_side(config) ** 2))
    return (int(height // ratio), int(width // ratio)) if ratio > 1.1 else (height, width)


def token_count(image_size: tuple[int, int], config) -> int:
    side = tile_side(config)
    rows, cols = grid_shape(image_size, config)
    shape = unpad(torch.empty((1, rows * side, cols * side), device="meta"), image_size).shape
    height, width = capped_shape(shape[1], shape[2], config)
    return side * side + height * (width + 1)  # the base view, then each unpadded row and its newline


def single_view_token_count(config) -> int:
    """An image encoded as its base view only (LLaVA-OneVision, several images in a prompt): its tokens and a
    newline."""
    return tile_side(config) ** 2 + 1


def max_token_count(config) -> int:
    """The most tokens an image can take (the largest grid, nothing cut)."""
    side = tile_side(config)
    patch = config.vision_config.image_size
    return side * side + max((h // patch * side) * (w // patch * side + 1) for h, w in config.image_grid_pinpoints)


def pooled_side(config) -> int:
    """LLaVA-OneVision videos: a frame's feature map is pooled (bilinearly) to this many rows and columns."""
    return math.ceil(tile_side(config) / 2)


def video_token_count(num_frames: int, config) -> int:
    """LLaVA-OneVision: each frame's pooled map, then one newline for the whole video."""
    return num_frames * pooled_side(config) ** 2 + 1
