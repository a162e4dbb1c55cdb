"""What a worker says actually hit its radix cache, read from the responses the router proxies: native
`meta_info` (per item for batches), OpenAI `usage`, Anthropic `usage`. Streams are scanned chunk by chunk as
they pass through; nothing is buffered beyond one incomplete SSE line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

# Only lines that can carry the numbers are parsed (a cheap byte test first: most chunks are text deltas).
_MARKERS = (b"cached_tokens", b"cache_read_input_tokens")
MAX_PENDING_LINE = 1 << 20  # a longer SSE line is dropped unparsed rather than held without bound


@dataclass(frozen=True)
class Usage:
    cached_tokens: int
    prompt_tokens: int
    first_cached: int  # the batch's first item (its text is the routing text); == cached_tokens for one item
    first_prompt: int


def _pair(obj: Any) -> tuple[int, int] | None:
    """(cached, prompt) of one response object or SSE event, None when it carries neither shape."""
    if not isinstance(obj, dict):
        return None
    meta = obj.get("meta_info")
    if isinstance(meta, dict) and "prompt_tokens" in meta:
        return int(meta.get("cached_tokens") or 0), int(meta["prompt_tokens"] or 0)
    usage = obj.get("usage")
    if usage is None and isinstance(obj.get("message"), dict):  # Anthropic message_start event
        usage = obj["message"].get("usage")
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage:
        details = usage.get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0), int(usage["prompt_tokens"] or 0)
    if "cache_read_input_tokens" in usage and "input_tokens" in usage:
        cached = int(usage["cache_read_input_tokens"] or 0)
        return cached, cached + int(usage["input_tokens"] or 0)
    return None


def usage_of(obj: Any) -> Usage | None:
    """Usage of a whole (non-streamed) JSON response; a list is a native batch (summed, first item kept)."""
    items = obj if isinstance(obj, list) else [obj]
    pairs = [p for p in (_pair(x) for x in items) if p is not None]
    if not pairs:
        return None
    return Usage(sum(c for c, _ in pairs), sum(p for _, p in pairs), pairs[0][0], pairs[0][1])


def usage_of_body(content: bytes) -> Usage | None:
    if not any(m in content for m in _MARKERS):
        return None
    try:
        return usage_of(orjson.loads(content))
    except orjson.JSONDecodeError:
        return None


class SseUsageScanner:
    """Fed each raw chunk of an SSE stream; keeps the last usage seen. Native streams repeat cumulative
    meta_info in every event and OpenAI puts usage in the final chunk, so the last one is the answer. A native
    batch stream interleaves items by `index`: the last report per index is kept and summed."""

    def __init__(self) -> None:
        self._pending = b""
        self._by_index: dict[int, tuple[int, int]] = {}

    def feed(self, chunk: bytes) -> None:
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_PENDING_LINE:
            self._pending = b""
        for line in lines:
            if line.startswith(b"data:") and any(m in line for m in _MARKERS):
                self._parse(line[5:].strip())

    def _parse(self, payload: bytes) -> None:
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        pair = _pair(obj)
        if pair is None:
            return
        index = obj.get("index", 0) if isinstance(obj, dict) else 0
        key = index if isinstance(index, int) else 0
        prev = self._by_index.get(key)
        if prev is not None and pair[1] == 0:
            return  # an Anthropic message_delta-like event without prompt counts must not erase them
        self._by_index[key] = pair

    def result(self) -> Usage | None:
        if self._pending.startswith(b"data:"):
            self.feed(b"\n")
        if not self._by_index:
            return None
        first = self._by_index[min(self._by_index)]
        return Usage(sum(c for c, _ in self._by_index.values()), sum(p for _, p in self._by_index.values()),
                     first[0], first[1])
