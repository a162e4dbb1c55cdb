"""A request's media as the runtime carries it: items (one image each) with their content hash, the prompt positions
their placeholder tokens fill, and the pad ids those positions hold.

Pad ids are at or above the language model's vocabulary size, so they never equal a real token; they are derived from
the item's hash, so the radix tree matches an image's positions exactly when the same image sits there (the
RadixAttention rule for images). Token i of an item is vocab + (h0 + i * h1) mod 2**30: two different images share
all their pad ids only if two 30-bit halves of their hashes both collide."""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PAD_RANGE = 1 << 30  # pad ids lie in [vocab_size, vocab_size + PAD_RANGE): below 2**31 for any real vocabulary


class Modality(str, enum.Enum):
    IMAGE = "image"
    VIDEO = "video"


def content_hash(pixel_values: "torch.Tensor", extra: str = "") -> str:
    """sha256 of the preprocessed pixels and `extra` (what else the encoder reads: the image size of a tiled image);
    the same picture in two encodings hashes the same."""
    import torch

    t = pixel_values.detach().to("cpu").contiguous()
    h = hashlib.sha256(str((tuple(t.shape), str(t.dtype), extra)).encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def pad_ids(hash_hex: str, count: int, vocab_size: int) -> list[int]:
    h0, h1 = int(hash_hex[:15], 16) % PAD_RANGE, int(hash_hex[15:30], 16) % PAD_RANGE | 1
    return [vocab_size + (h0 + i * h1) % PAD_RANGE for i in range(count)]


@dataclass
class MultimodalItem:
    """One image or video: its encoder input and where its tokens sit in the prompt (set by the front)."""

    modality: Modality
    hash: str  # content_hash of `pixel_values`
    pixel_values: "torch.Tensor"  # the model's processor output for this item, float32 on the host
    offset: int  # prompt position of its first token
    num_tokens: int  # placeholder tokens it fills (= rows of its encoder output)
    image_size: tuple[int, int] | None = None  # (height, width) before preprocessing, where the layout depends on it
    grid_thw: tuple[int, int, int] | None = None  # Qwen2-VL: the encoder's patch grid (time, height, width)
    second_per_grid_t: float | None = None  # Qwen2.5-VL videos: seconds a temporal patch spans (spaces time positions)

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens


@dataclass
class MultimodalSpan:
    """Rows of a pass that take an item's encoder output: pass rows [row, row + end - start) get the item's output
    rows [start, end) (set by the planner; read by the executor's embedder)."""

    row: int
    item: MultimodalItem
    start: int
    end: int


@dataclass
class MRopePositions:
    """Qwen2-VL's rotary positions of a prompt: three rows (time, height, width) with a column per prompt token (an
    image's tokens take its grid's coordinates, text counts on from the largest position so far); a position p past
    the prompt is p + delta on all three axes."""

    rows: tuple[list[int], list[int], list[int]]
    delta: int

    def axis(self, a: int, start: int, end: int) -> list[int]:
        n = len(self.rows[a])
        return self.rows[a][start:min(end, n)] + [p + self.delta for p in range(max(start, n), end)]


def _time_positions(t: int, item: MultimodalItem, tokens_per_second: float | None) -> list[int]:
    """A grid's temporal coordinates: 0 .. t-1, or for a Qwen2.5-VL video its patches' start times in units of
    1 / tokens_per_second seconds, truncated (float32, as transformers computes them)."""
    if tokens_per_second is None or item.modality is not Modality.VIDEO or item.second_per_grid_t is None:
        return list(range(t))
    import torch

    interval = torch.tensor(tokens_per_second, dtype=torch.float32) * torch.tensor(item.second_per_grid_t,
                                                                                   dtype=torch.float32)
    return (torch.arange(t) * interval).long().tolist()


def mrope_positions(num_tokens: int, items: list[MultimodalItem], merge: int,
                    tokens_per_second: float | None = None) -> MRopePositions:
    """Qwen2-VL's positions for a prompt of `num_tokens` whose images are `items`: text counts on by one on all three
    axes; an image's merged grid (t, h, w) takes start + (t, h, w) coordinates (Qwen2.5-VL videos: t spaced by time,
    `tokens_per_second` set), and the text after it starts at start + max(h, w). Positions past the prompt continue
    from the largest position of all (a video's time coordinates may pass the text after it)."""
    rows: tuple[list[int], list[int], list[int]] = ([], [], [])
    nxt, pos = 0, 0
    for it in items:
        for axis in rows:
            axis.extend(range(nxt, nxt + it.offset - pos))
        nxt += it.offset - pos
        t, h, w = it.grid_thw[0], it.grid_thw[1] // merge, it.grid_thw[2] // merge
        for ti in _time_positions(t, it, tokens_per_second):
            for hi in range(h):
                rows[0].extend([nxt + ti] * w)
                rows[1].extend([nxt + hi] * w)
                rows[2].extend(range(nxt, nxt + w))
        nxt += max(h, w)
        pos = it.end
    for axis in rows:
        axis.extend(range(nxt, nxt + num_tokens - pos))
    top = max((max(axis) for axis in rows if axis), default=-1)
    return MRopePositions(rows, top + 1 - num_tokens)


@dataclass
class MultimodalInputs:
    """A request's items in prompt order (non-overlapping)."""

    items: list[MultimodalItem] = field(default_factory=list)
    mrope: MRopePositions | None = None  # set for models with multimodal rotary positions

    def spans(self, row: int, start: int, end: int) -> list[MultimodalSpan]:
        """The spans of prompt positions [start, end), whose first position is pass row `row`."""
        out = []
        for item in self.items:
            lo, hi = max(start, item.offset), min(end, item.end)
            if lo < hi:
                out.append(MultimodalSpan(row + lo - start, item, lo - item.offset, hi - item.offset))
        return out

    def positions(self) -> list[range]:
        return [range(it.offset, it.end) for it in self.items]
