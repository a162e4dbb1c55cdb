"""Records every request a backend sends (an httpx transport around the real one): prompts, outputs and the
server's token counts, for the achieved and the optimal cache hit rate of a run.

Native /generate requests (RuntimeEndpoint) give prompt text or input_ids and the output ids; OpenAI-compatible
/v1/completions and /v1/chat/completions give prompt text or messages and the output text. Prompts are turned
into token ids afterwards with the model's tokenizer (`token_requests`). Streaming responses pass through
unrecorded (the workloads do not stream)."""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import httpx

from radixlm.bench.programs.optimal import Request

RECORDED_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")


@dataclass
class Sent:
    prompt_text: Optional[str] = None
    prompt_ids: Optional[list[int]] = None
    messages: Optional[list[dict]] = None
    output_ids: Optional[list[int]] = None
    output_text: str = ""
    prompt_tokens: Optional[int] = None  # server-reported
    cached_tokens: Optional[int] = None
    completion_tokens: int = 0
    images: tuple[str, ...] = ()  # a digest per image_data item, in prompt order


@dataclass
class Recorder:
    sent: list[Sent] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: int = 0

    def clear(self) -> None:
        with self.lock:
            self.sent.clear()
            self.errors = 0

    def add(self, items: list[Sent]) -> None:
        with self.lock:
            self.sent.extend(items)

    def summary(self) -> dict:
        with self.lock:
            sent = list(self.sent)
        known = [s for s in sent if s.prompt_tokens is not None and s.cached_tokens is not None]
        prompt = sum(s.prompt_tokens for s in known)
        cached = sum(s.cached_tokens for s in known)
        return {"requests": len(sent), "http_errors": self.errors,
                "prompt_tokens": sum(s.prompt_tokens or 0 for s in sent),
                "output_tokens": sum(s.completion_tokens for s in sent),
                "cached_tokens": cached if known else None,
                "cache_hit_rate": (cached / prompt if prompt else 0.0) if known else None}


class RecordingTransport(httpx.BaseTransport):
    def __init__(self, recorder: Recorder, inner: Optional[httpx.BaseTransport] = None) -> None:
        self.recorder = recorder
        self.inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method != "POST" or not path.endswith(RECORDED_PATHS):
            return self.inner.handle_request(request)
        try:
            body = json.loads(request.read() or b"{}")
        except ValueError:
            body = {}
        if body.get("stream"):
            return self.inner.handle_request(request)
        response = self.inner.handle_request(request)
        content = response.read()
        if response.status_code != 200:
            with self.recorder.lock:
                self.recorder.errors += 1
        else:
            try:
                self.recorder.add(parse_exchange(path, body, json.loads(content)))
            except (ValueError, KeyError, TypeError, AttributeError):
                with self.recorder.lock:
                    self.recorder.errors += 1
        return httpx.Response(response.status_code, headers=response.headers, content=content,
                              request=request, extensions=response.extensions)

    def close(self) -> None:
        self.inner.close()


def _as_list(x: Any) -> list:
    return x if isinstance(x, list) else [x]


def parse_exchange(path: str, body: dict, resp: Any) -> list[Sent]:
    if path.endswith("/generate"):
        if "input_ids" in body and body["input_ids"] is not None:
            ids = body["input_ids"]
            prompts = [Sent(prompt_ids=list(x)) for x in (ids if ids and isinstance(ids[0], list) else [ids])]
        else:
            prompts = [Sent(prompt_text=t) for t in _as_list(body.get("text"))]
        images = body.get("image_data") or []
        per_prompt = images if len(prompts) > 1 and images and isinstance(images[0], list) else [images] * len(prompts)
        for p, items in zip(prompts, per_prompt):
            p.images = tuple(hashlib.sha256(str(x).encode()).hexdigest()[:15] for x in _as_list(items or []))
        outs = _as_list(resp)
        # n > 1 gives n outputs per prompt, prompt-major.
        per = max(1, len(outs) // max(1, len(prompts)))
        result = []
        for i, o in enumerate(outs):
            base = prompts[min(i // per, len(prompts) - 1)]
            meta = o.get("meta_info", {})
            result.append(Sent(base.prompt_text, base.prompt_ids, None, list(o.get("output_ids") or []),
                               o.get("text", ""), meta.get("prompt_tokens"), meta.get("cached_tokens"),
                               meta.get("completion_tokens", 0), base.images))
        return result
    usage = resp.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    texts = [(c.get("message") or {}).get("content") or "" for c in resp.get("choices") or []]
    if path.endswith("/chat/completions"):
        sents = [Sent(messages=body.get("messages"), output_text="".join(texts))]
    else:
        # A list of prompts (a batched select) gives one entry each; the usage totals go on the first.
        sents = [Sent(prompt_text=p) for p in _as_list(body.get("prompt"))]
        for c in resp.get("choices") or []:
            i = c.get("index", 0)
            if 0 <= i < len(sents):
                sents[i].output_text += c.get("text") or ""
    sents[0].prompt_tokens, sents[0].cached_tokens = usage.get("prompt_tokens"), cached
    sents[0].completion_tokens = usage.get("completion_tokens", 0)
    for s in sents[1:]:
        s.prompt_tokens = s.cached_tokens = None
    return sents


def with_images(text: str, ids: list[int], s: Sent, tokenizer: Any, image_token: Optional[str]) -> list[int]:
    """The prompt as the server caches it: each image's placeholder followed by a run of tokens that stand for the
    image (negative ids from its digest: equal images match, different ones do not), the runs together as long as
    the server's prompt_tokens exceed the text's (an even share per image)."""
    if not s.images or not image_token or s.prompt_tokens is None or s.prompt_tokens <= len(ids):
        return ids
    extra, k = s.prompt_tokens - len(ids), len(s.images)
    ends, at = [], 0
    for _ in s.images:
        at = text.find(image_token, at)
        if at < 0:
            return ids
        at += len(image_token)
        ends.append(len(tokenizer.encode(text[:at])))
    out = list(ids)
    for i in reversed(range(k)):
        run = extra // k + (extra % k if i == k - 1 else 0)
        out[ends[i]:ends[i]] = [-1 - int(s.images[i], 16)] * run
    return out


def token_requests(sent: list[Sent], tokenizer: Any,
                   image_token: Optional[str] = None) -> tuple[list[Request], int]:
    """The recorded requests as token ids (images per with_images); also how many prompt lengths differ from the
    server's count."""
    out, mismatched = [], 0
    for s in sent:
        if s.prompt_ids is not None:
            prompt = s.prompt_ids
        elif s.prompt_text is not None:
            prompt = with_images(s.prompt_text, tokenizer.encode(s.prompt_text), s, tokenizer, image_token)
        elif s.messages is not None:
            prompt = list(tokenizer.apply_chat_template(s.messages, add_generation_prompt=True, tokenize=True))
        else:
            continue
        if s.prompt_tokens is not None and s.prompt_tokens != len(prompt):
            mismatched += 1
        if s.output_ids is not None:
            out.append(Request(list(prompt), list(s.output_ids)))
            continue
        # Output known as text only: tokenize it with its prompt, as the next prompt that carries it will be.
        if s.messages is not None:
            full = list(tokenizer.apply_chat_template(
                s.messages + [{"role": "assistant", "content": s.output_text}], tokenize=True))
        else:
            full = tokenizer.encode(s.prompt_text + s.output_text)
        k = 0
        while k < min(len(full), len(prompt)) and full[k] == prompt[k]:
            k += 1
        out.append(Request(list(prompt), full=full, gen_from=k))
    return out, mismatched
