"""The input embeddings of a pass with media rows: token embeddings, with each span's rows replaced by its item's
encoder output. The encoder runs only for items some row of the pass needs (positions the radix cache covers are not
rows) and its outputs are kept by content hash, so the chunks of a prefill that splits an image encode it once."""
from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import torch

from radixlm.runtime.multimodal.inputs import MultimodalItem, MultimodalSpan

DEFAULT_CACHE_BYTES = 1 << 30


class MultimodalModel(Protocol):
    vocab_size: int

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def encode_items(self, items: list[MultimodalItem]) -> list[torch.Tensor]:
        """One (num_tokens, hidden_size) tensor per item."""


class EncoderCache:
    """Encoder outputs by content hash, least recently used first out once over `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> torch.Tensor | None:
        t = self.entries.get(key)
        if t is not None:
            self.entries.move_to_end(key)
            self.hits += 1
        return t

    def put(self, key: str, value: torch.Tensor) -> None:
        if key in self.entries:
            return
        self.entries[key] = value
        self.bytes += value.numel() * value.element_size()
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


class MultimodalEmbedder:
    def __init__(self, model: MultimodalModel, cache: EncoderCache):
        self.model = model
        self.cache = cache

    def features(self, spans: list[MultimodalSpan]) -> dict[str, torch.Tensor]:
        """Encoder outputs of the spans' items by hash; the missing ones encoded together."""
        found: dict[str, torch.Tensor] = {}
        todo: dict[str, MultimodalItem] = {}
        for s in spans:
            h = s.item.hash
            if h in found or h in todo:
                continue
            cached = self.cache.get(h)
            if cached is None:
                todo[h] = s.item
            else:
                found[h] = cached
        if todo:
            self.cache.misses += len(todo)
            for h, out in zip(todo, self.model.encode_items(list(todo.values()))):
                if out.shape[0] != todo[h].num_tokens:
                    raise ValueError(f"the encoder gave {out.shape[0]} rows for an item of {todo[h].num_tokens} tokens")
                self.cache.put(h, out)
                found[h] = out
        return found

    def embed(self, input_ids: torch.Tensor, spans: list[MultimodalSpan]) -> torch.Tensor:
        # Pad ids are at or above the vocabulary: every such row is overwritten below (or belongs to a draft that the
        # sampler, which never yields a pad id, rejects).
        embeds = self.model.embed_input_ids(input_ids.clamp(max=self.model.vocab_size - 1))
        feats = self.features(spans)
        for s in spans:
            embeds[s.row : s.row + s.end - s.start] = feats[s.item.hash][s.start : s.end].to(embeds.dtype)
        return embeds
