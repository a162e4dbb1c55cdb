"""Pieces shared by /v1/completions and /v1/chat/completions: request building with OpenAI's length
errors, running (with client-disconnect aborts), merged streaming of several samples, usage and finish reasons."""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response

from radixlm.runtime.front import BuiltRequests, bootstrap_info
from radixlm.runtime.errors import ApiError
from radixlm.runtime.server.errors import ApiFlavor, BadRequest, error_body
from radixlm.runtime.server.native import ClientDisconnected, generate_or_abort
from radixlm.runtime.tokenizer_manager import RuntimeDead



def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_lengths(tm, prompts: list[list[int]], max_new_tokens: int, extra_tokens: int = 0) -> None:
    """OpenAI's messages for a prompt, or prompt + max_tokens, beyond the context (checked before the core's).
    extra_tokens: what each prompt gains in the front (its images' tokens)."""
    context = tm.runtime.info.context_len
    for ids in prompts:
        n = len(ids) + extra_tokens
        if n >= context:
            raise BadRequest(f"The input ({n} tokens) is longer than the model's context length ({context} tokens).")
        if n + max_new_tokens > context:
            raise BadRequest(f"max_completion_tokens is too large: {max_new_tokens}. The input has {n} tokens "
                             f"and the model's context length is {context} tokens.")


def adapter_of(tm, req) -> str | None:
    """The LoRA adapter a request names: its lora_path, else its model (an adapter's name or base:adapter)."""
    try:
        return req.lora_path or tm.builder.lora.adapter_of_model(req.model, tm.server_args.model_path)
    except ValueError as e:
        raise BadRequest(str(e)) from None


def bootstrap_of(req):
    """A disaggregated pair's room (the PD router's bootstrap fields), or None."""
    try:
        return bootstrap_info(req.bootstrap_host, req.bootstrap_port, req.bootstrap_room)
    except ValueError as e:
        raise BadRequest(str(e)) from None


async def build(tm, **kwargs) -> BuiltRequests:
    try:
        return await tm.build_async(**kwargs)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e)) from None


async def run(request: Request, tm, built: BuiltRequests) -> list[dict]:
    """Non-streaming: every sample's final result, in build order; a client that goes away aborts them."""
    try:
        res = await generate_or_abort(request, tm, built, True)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return res if isinstance(res, list) else [res]


async def respond(request: Request, tm, built: BuiltRequests, make) -> Response:
    try:
        results = await run(request, tm, built)
    except ClientDisconnected:
        return Response(status_code=499)
    return Response(orjson.dumps(make(results)), media_type="application/json")


async def merged_stream(tm, built: BuiltRequests) -> AsyncIterator[tuple[int, dict]]:
    """Streams every sample at once, yielding (index in build order, cumulative snapshot).

    The core streams one request per call, so each sample is streamed on its own; cancelling this
    generator (client gone) cancels them all, which aborts the unfinished ones."""
    for m in built.msgs:
        m.stream = True
    if len(built.msgs) == 1:  # n = 1: no pump task and queue hop per chunk
        async with contextlib.aclosing(tm.generate_stream(built.msgs[0], True)) as stream:
            async for snap in stream:  # closed (the request aborted if unfinished) when this generator is
                yield 0, snap
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, msg) -> None:
        try:
            async for snap in tm.generate_stream(msg, True):
                queue.put_nowait((i, snap))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((i, e))
            return
        queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, m)) for i, m in enumerate(built.msgs)]
    live = len(tasks)
    try:
        while live:
            i, item = await queue.get()
            if item is None:
                live -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def sse_body(events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    try:
        async for ev in events:
            yield sse(ev)
    except RuntimeDead as e:
        yield sse(error_body(str(e), 503, ApiFlavor.OPENAI))
    except ApiError as e:
        yield sse(error_body(str(e), e.status_code, ApiFlavor.OPENAI))
    except ValueError as e:
        yield sse(error_body(str(e), 400, ApiFlavor.OPENAI))
    yield b"data: [DONE]\n\n"


def finish(meta: dict) -> tuple[str | None, str | int | None]:
    """(OpenAI finish_reason, matched_stop) from the core's finish_reason dict."""
    fr = meta.get("finish_reason")
    if fr is None:
        return None, None
    kind = fr.get("type")
    if kind == "stop":
        return "stop", fr.get("matched")
    return ("length" if kind == "length" else "abort" if kind == "abort" else str(kind)), None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int | None = None  # set with a reasoning parser: completion_tokens_details.reasoning_tokens

    @classmethod
    def of(cls, results: list[dict], n: int, reasoning_tokens: int | None = None) -> "Usage":
        """The prompt of n samples counts once, like SGLang and OpenAI; cached tokens count per sample."""
        metas = [r["meta_info"] for r in results]
        return cls(sum(m.get("prompt_tokens", 0) for m in metas[::n]), sum(m.get("completion_tokens", 0) for m in metas),
                   sum(m.get("cached_tokens", 0) for m in metas), reasoning_tokens)

    def to_dict(self) -> dict:
        out = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "total_tokens": self.prompt_tokens + self.completion_tokens,
               "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out
