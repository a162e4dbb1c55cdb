"""Server-sent events of a streamed generation to a RequestResult: TTFT, inter-token gaps, token counts."""
from __future__ import annotations

import re
import time

import httpx
import orjson

from radixlm.bench.metrics import RequestResult

_COMPLETION_KEY = b'"completion_tokens":'
_INT = re.compile(rb"\s*(\d+)")


class StreamTimer:
    """Turns output arrivals into TTFT and ITL; a chunk carrying k new tokens adds k gaps of (gap / k)."""

    def __init__(self, res: RequestResult, start: float):
        self.res, self.start, self.last = res, start, start
        self.tokens = 0

    def add(self, new_tokens: int, now: float) -> None:
        if new_tokens <= 0:
            return
        if self.tokens == 0:
            self.res.ttft = now - self.start
        else:
            self.res.itl.extend([(now - self.last) / new_tokens] * new_tokens)
        self.tokens += new_tokens
        self.last = now


def split_events(buf: bytes, raw: bytes) -> tuple[list[bytes], bytes]:
    """The SSE `data:` payloads completed by `raw`, and the bytes left over. Split on \\n only (SSE's line ends are
    \\r\\n, \\n, \\r): a generic line splitter also splits on U+2028, U+0085 and the like, which JSON strings of
    generated text carry unescaped."""
    *lines, rest = (buf + raw).split(b"\n")
    return [line[5:].strip() for line in lines if line.startswith(b"data:")], rest


async def sse_data(resp: httpx.Response):
    buf = b""
    async for raw in resp.aiter_bytes():
        events, buf = split_events(buf, raw)
        for data in events:
            if data == b"[DONE]":
                return
            yield orjson.loads(data)


def native_completion_tokens(data: bytes) -> int | None:
    """meta_info.completion_tokens read without decoding the chunk (native chunks carry the whole output so far, so
    decoding each is quadratic in the output length); None when the chunk has no such key. The key cannot occur
    inside a JSON string, whose quotes are escaped."""
    at = data.rfind(_COMPLETION_KEY)
    if at < 0:
        return None
    m = _INT.match(data, at + len(_COMPLETION_KEY))
    return int(m.group(1)) if m else None


def _handle_native(chunk: dict, res: RequestResult, timer: StreamTimer, now: float) -> None:
    meta = chunk.get("meta_info", {})
    done = meta.get("completion_tokens", len(chunk.get("output_ids") or []))
    timer.add(done - timer.tokens, now)
    res.output_len = done
    _native_meta(meta, res)


def _native_meta(meta: dict, res: RequestResult) -> None:
    if "prompt_tokens" in meta:
        res.prompt_len = meta["prompt_tokens"]
    if meta.get("cached_tokens") is not None:
        res.cached_tokens = meta["cached_tokens"]


def _handle_openai(chunk: dict, res: RequestResult, timer: StreamTimer, now: float, chat: bool) -> None:
    # OpenAI chunks carry text deltas without token counts: one non-empty delta counts as one token until the
    # final usage chunk gives the true total.
    for choice in chunk.get("choices") or []:
        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        if piece:
            timer.add(1, now)
    usage = chunk.get("usage")
    if usage:
        res.output_len = usage.get("completion_tokens", timer.tokens)
        res.prompt_len = usage.get("prompt_tokens", res.prompt_len)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is not None:
            res.cached_tokens = cached


class StreamReader:
    """One request's SSE bytes to RequestResult: one clock read per network read (the events it completes
    arrived together), native chunks counted from completion_tokens and decoded only when the last one is."""

    def __init__(self, native: bool, chat: bool, res: RequestResult, start: float):
        self.native, self.chat = native, chat
        self.res, self.timer = res, StreamTimer(res, start)
        self.buf, self.last, self.finished = b"", b"", False

    def feed(self, raw: bytes) -> None:
        """Bytes after [DONE] or an error are ignored (the caller reads to the end, so the connection is reused)."""
        if self.finished or self.res.error:
            return
        now = time.perf_counter()
        events, self.buf = split_events(self.buf, raw)
        for data in events:
            if data == b"[DONE]":
                self.finished = True
                return
            if b'"error"' in data:
                chunk = orjson.loads(data)
                if "error" in chunk:
                    self.res.error = str(chunk["error"])[:200]
                    return
            if self.native:
                done = native_completion_tokens(data)
                if done is None:
                    _handle_native(orjson.loads(data), self.res, self.timer, now)
                else:
                    self.timer.add(done - self.timer.tokens, now)
                    self.res.output_len = done
                    self.last = data
            else:
                _handle_openai(orjson.loads(data), self.res, self.timer, now, self.chat)

    def close(self, start: float) -> None:
        res = self.res
        if res.error:
            return
        if self.last:
            _native_meta(orjson.loads(self.last).get("meta_info", {}), res)
        res.latency = time.perf_counter() - start
        if res.output_len == 0:
            res.output_len = self.timer.tokens
        res.ok = self.timer.tokens > 0
        if not res.ok:
            res.error = "no output tokens"
