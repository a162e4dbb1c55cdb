"""POST /v1/responses (OpenAI's Responses API; plain and streamed), GET and DELETE /v1/responses/{response_id}.

A request is translated into a chat request and runs through the chat pipeline (prepare_chat: template, tool plan,
checks); its output is read into blocks (output_blocks) and rendered as output items. `store` keeps the Response and
its conversation in the app's ResponseStore, which `previous_response_id` continues."""
from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from radixlm.runtime.errors import ApiError
from radixlm.runtime.server.errors import NotFound, parse
from radixlm.runtime.server.native import json_response, read_json_object
from radixlm.runtime.server.openai import responses_protocol as proto
from radixlm.runtime.server.openai.chat import prepare_chat
from radixlm.runtime.server.openai.common import finish, merged_stream, respond
from radixlm.runtime.server.openai.protocol import ChatMessage
from radixlm.runtime.server.openai.response_store import ResponseStore, StoredResponse
from radixlm.runtime.server.openai.reasoning import reasoning_token_count, request_parser
from radixlm.runtime.server.openapi import request_body
from radixlm.runtime.server.output_blocks import Block, BlockEvent, BlockKind, BlockStream, EventType, final_blocks
from radixlm.runtime.tokenizer_manager import RuntimeDead

router = APIRouter()


def _store(request: Request) -> ResponseStore:
    return request.app.state.response_store


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.")


def _item_status(reason: str | None) -> str:
    return "incomplete" if reason in ("length", "abort") else "completed"


class _Turn:
    """One request's conversation: what it continues, its input, and the store it is kept in."""

    def __init__(self, store: ResponseStore, req: proto.ResponsesRequest, history: tuple[ChatMessage, ...],
                 new: list[ChatMessage]):
        self.store, self.req, self.history, self.new = store, req, history, new

    def keep(self, body: dict, blocks: list[Block]) -> None:
        if not self.req.store:
            return
        reply = proto.output_message(blocks)
        history = (*self.history, *self.new, *([reply] if reply is not None else []))
        self.store.put(body["id"], StoredResponse(body, history))


@router.post("/v1/responses", openapi_extra=request_body(proto.ResponsesRequest))
async def create_response(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: proto.ResponsesRequest = parse(proto.ResponsesRequest, await read_json_object(request))
    store = _store(request)
    history: tuple[ChatMessage, ...] = ()
    if req.previous_response_id is not None:
        prev = store.get(req.previous_response_id)
        if prev is None:
            raise NotFound(f"Previous response with id '{req.previous_response_id}' not found.")
        history = prev.history
    resp_id = proto.new_response_id()
    chat_req, new = req.to_chat(history, resp_id)
    reasoning = request_parser(tm.server_args.reasoning_parser, True, chat_req.chat_template_kwargs)
    built, plan = await prepare_chat(tm, chat_req)
    turn = _Turn(store, req, history, new)
    head = (resp_id, int(time.time()), req, req.model or tm.server_args.model_path)
    if req.stream:
        if tm.dead is not None:
            raise RuntimeDead(tm.dead)
        return StreamingResponse(_events(tm, built, BlockStream(plan, reasoning), head, turn),
                                 media_type="text/event-stream")

    def make(results: list[dict]) -> dict:
        meta = results[0]["meta_info"]
        reason, _ = finish(meta)
        blocks = final_blocks(plan, results[0]["text"], reasoning)
        output = [proto.output_item(b, proto.item_id(b.kind), _item_status(reason))
                  for b in blocks]
        status, incomplete = proto.status_of(reason)
        body = proto.response_body(*head, status, output, proto.usage(meta, _reasoning_tokens(tm, blocks)), incomplete)
        turn.keep(body, blocks)
        return body

    return await respond(request, tm, built, make)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> Response:
    stored = _store(request).get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return json_response(stored.body)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    if not _store(request).delete(response_id):
        raise _not_found(response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


def _sse(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class EventRenderer:
    """Block events as the Responses API's stream events, each numbered."""

    def __init__(self):
        self.seq = itertools.count()
        self.ids: dict[int, str] = {}
        self.items: list[dict] = []  # the output items done so far

    def event(self, kind: str, **data) -> bytes:
        return _sse({"type": kind, "sequence_number": next(self.seq), **data})

    def render(self, e: BlockEvent, status: str) -> list[bytes]:
        kind = e.block.kind
        at = {"output_index": e.index}
        if e.type is EventType.START:
            item = self.ids[e.index] = proto.item_id(kind)
            out = [self.event("response.output_item.added", **at, item=proto.output_item(e.block, item, "in_progress"))]
            if kind is not BlockKind.TOOL_CALL:
                out.append(self.event("response.content_part.added", item_id=item, **at, content_index=0,
                                      part=_part(kind, "")))
            return out
        item = self.ids[e.index]
        if e.type is EventType.DELTA:
            if kind is BlockKind.TEXT:
                return [self.event("response.output_text.delta", item_id=item, **at, content_index=0,
                                   delta=e.block.text, logprobs=[])]
            if kind is BlockKind.REASONING:
                return [self.event("response.reasoning_text.delta", item_id=item, **at, content_index=0,
                                   delta=e.block.text)]
            return [self.event("response.function_call_arguments.delta", item_id=item, **at, delta=e.block.text)]
        done = proto.output_item(e.block, item, status)
        self.items.append(done)
        if kind is BlockKind.TOOL_CALL:
            return [self.event("response.function_call_arguments.done", item_id=item, **at, arguments=e.block.text),
                    self.event("response.output_item.done", **at, item=done)]
        text_done = (self.event("response.output_text.done", item_id=item, **at, content_index=0, text=e.block.text,
                                logprobs=[]) if kind is BlockKind.TEXT else
                     self.event("response.reasoning_text.done", item_id=item, **at, content_index=0,
                                text=e.block.text))
        return [text_done,
                self.event("response.content_part.done", item_id=item, **at, content_index=0,
                           part=_part(kind, e.block.text)),
                self.event("response.output_item.done", **at, item=done)]


def _reasoning_tokens(tm, blocks: list[Block]) -> int:
    return reasoning_token_count(tm.tokenizer, [b.text for b in blocks if b.kind is BlockKind.REASONING])


def _part(kind: BlockKind, text: str) -> dict:
    return proto.reasoning_text(text) if kind is BlockKind.REASONING else proto.output_text(text)


async def _events(tm, built, blocks: BlockStream, head: tuple, turn: _Turn) -> AsyncIterator[bytes]:
    r = EventRenderer()
    started = proto.response_body(*head, "in_progress", [], None)
    yield r.event("response.created", response=started)
    yield r.event("response.in_progress", response=started)
    meta, reason = None, None
    try:
        async for _, snap in merged_stream(tm, built):
            meta = snap["meta_info"]
            reason, _ = finish(meta)
            for e in blocks.feed(snap["text"], reason is not None):
                for chunk in r.render(e, _item_status(reason)):
                    yield chunk
    except (RuntimeDead, ApiError, ValueError) as e:
        code = 400 if isinstance(e, ValueError) else 503 if isinstance(e, RuntimeDead) else e.status_code
        yield r.event("error", code=str(code), message=str(e), param=None)
        return
    status, incomplete = proto.status_of(reason)
    body = proto.response_body(*head, status, r.items, proto.usage(meta, _reasoning_tokens(tm, blocks.blocks)),
                               incomplete)
    turn.keep(body, blocks.blocks)
    yield r.event("response.completed" if status == "completed" else "response.incomplete", response=body)
