"""The input embeddings of a pass with media rows: token embeddings, with each span's rows replaced by its item's
encoder output. The encoder runs only for items some row of the pass needs (positions the radix cache covers are not
rows) and its outputs are kept by content hash, so the chunks of a prefill that splits an image encode it once."""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
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


@dataclass
class EncoderTimer:
    """Time spent in the encoder. On CUDA each run is bracketed by events and counted once its end event has
    completed (reading the timer never waits for the device)."""

    items: int = 0
    seconds: float = 0.0
    pending: list[tuple["torch.cuda.Event", "torch.cuda.Event"]] = field(default_factory=list)

    def start(self, device: torch.device) -> "torch.cuda.Event | float":
        if device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, started: "torch.cuda.Event | float", items: int) -> None:
        self.items += items
        if isinstance(started, float):
            self.seconds += time.perf_counter() - started
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.pending.append((started, end))

    def snapshot(self) -> dict[str, float]:
        ended = [end.query() for _, end in self.pending]
        self.seconds += sum(s.elapsed_time(e) for (s, e), d in zip(self.pending, ended) if d) / 1e3
        self.pending = [p for p, d in zip(self.pending, ended) if not d]
        return {"mm_encoded_items": self.items, "mm_encoder_seconds": self.seconds}


class MultimodalEmbedder:
    def __init__(self, model: MultimodalModel, cache: EncoderCache):
        self.model = model
        self.cache = cache
        self.timer = EncoderTimer()
        first = next(model.parameters(), None) if hasattr(model, "parameters") else None
        self.device = first.device if first is not None else torch.device("cpu")

    def stats(self) -> dict[str, float]:
        return {**self.timer.snapshot(), "mm_encoder_cache_hits": self.cache.hits}

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
            started = self.timer.start(self.device)
            outs = self.model.encode_items(list(todo.values()))
            self.timer.stop(started, len(todo))
            for h, out in zip(todo, outs):
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
