"""Anthropic Messages API: POST /v1/messages (plain and SSE-streamed, with tools) and /v1/messages/count_tokens.
A request is translated into a chat request and runs through the chat pipeline (prepare_chat); its output is read
into blocks (output_blocks): thinking (with --reasoning-parser), text and tool_use content blocks.
Errors answer in Anthropic's shape {type: "error", error: {type, message}} (the app's handlers pick it by path);
an operator's abort is a normal end with stop_reason "abort", as the other APIs finish with "abort"."""
from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from radixlm.runtime.server import anthropic_protocol as proto
from radixlm.runtime.server import anthropic_render as render
from radixlm.runtime.errors import ApiError
from radixlm.runtime.parsers.reasoning import family
from radixlm.runtime.server.errors import ApiFlavor, error_body
from radixlm.runtime.server.native import ClientDisconnected, json_response
from radixlm.runtime.server.openai.chat import chat_prompt_ids, prepare_chat
from radixlm.runtime.server.openai.common import merged_stream, run
from radixlm.runtime.server.openai.reasoning import request_parser
from radixlm.runtime.server.openai.tool_calls import plan_tools
from radixlm.runtime.server.openapi import request_body
from radixlm.runtime.server.output_blocks import BlockEvent, BlockKind, BlockStream, EventType, final_blocks
from radixlm.runtime.tokenizer_manager import RuntimeDead

router = APIRouter()


@router.post("/v1/messages/count_tokens", openapi_extra=request_body(proto.Conversation))
async def count_tokens(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    conv = proto.parse(proto.Conversation, await request.body())
    chat = conv.to_chat()
    plan = plan_tools(chat, tm.server_args.tool_call_parser, getattr(tm.tokenizer, "chat_template", None))
    ids = chat_prompt_ids(tm, chat.messages, chat.continue_final_message, conv.template_kwargs(_toggle(tm)),
                          plan.template_tools)
    images = sum(len(m.image_urls()) for m in chat.messages)
    return json_response({"input_tokens": len(ids) + tm.builder.media_token_count(images)})


@router.post("/v1/messages", openapi_extra=request_body(proto.MessagesRequest))
async def messages(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    msg_id = render.new_message_id()
    req: proto.MessagesRequest = proto.parse(proto.MessagesRequest, await request.body())
    name = tm.server_args.reasoning_parser
    chat = req.chat_request(msg_id, _toggle(tm), name is not None and family(name).tags is not None)
    reasoning = request_parser(tm.server_args.reasoning_parser, True, chat.chat_template_kwargs)
    # prepare_chat runs the model's LoRA adapter, if it names one (or base:adapter), as on the OpenAI routes.
    built, plan = await prepare_chat(tm, chat)
    if tm.dead is not None:
        raise RuntimeDead(tm.dead)
    if req.stream:
        return StreamingResponse(_events(tm, built, BlockStream(plan, reasoning), req, msg_id),
                                 media_type="text/event-stream")
    try:
        out = (await run(request, tm, built))[0]
    except ClientDisconnected:
        return Response(status_code=499)
    meta = out["meta_info"]
    blocks = final_blocks(plan, out["text"], reasoning)
    called = any(b.kind is BlockKind.TOOL_CALL for b in blocks)
    stop_reason, stop_sequence = render.stop_info(meta["finish_reason"], req.stop_sequences, called)
    content = [render.content_block(b, omit_thinking=req.omit_thinking) for b in blocks]
    return json_response(render.message_body(msg_id, req.model, content, stop_reason, stop_sequence, render.usage(meta)))


def _event(name: str, data: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _toggle(tm) -> str | None:
    """The chat_template_kwargs key that the request's `thinking` sets: the reasoning family's (None: no parser)."""
    name = tm.server_args.reasoning_parser
    return None if name is None else family(name).toggle


def _delta(index: int, delta: dict) -> bytes:
    return _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def block_events(e: BlockEvent, omit_thinking: bool = False) -> list[bytes]:
    """A block event as Anthropic's stream events (a thinking block's signature comes just before its stop)."""
    thinking = e.block.kind is BlockKind.REASONING
    if e.type is EventType.START:
        return [_event("content_block_start", {"type": "content_block_start", "index": e.index,
                                               "content_block": render.content_block(e.block, streaming=True)})]
    if e.type is EventType.DELTA:
        return [] if thinking and omit_thinking else [_delta(e.index, render.block_delta(e.block))]
    stop = _event("content_block_stop", {"type": "content_block_stop", "index": e.index})
    if thinking:
        return [_delta(e.index, {"type": "signature_delta", "signature": render.SIGNATURE}), stop]
    return [stop]


async def _events(tm, built, blocks: BlockStream, req: proto.MessagesRequest, msg_id: str) -> AsyncIterator[bytes]:
    started = pinged = False
    try:
        async for _, snap in merged_stream(tm, built):
            meta = snap["meta_info"]
            finish = meta["finish_reason"]
            if not started:
                # Sent with the first snapshot, so its usage counts the cached prompt tokens correctly.
                start_usage = dict(render.usage(meta), output_tokens=0)
                yield _event("message_start", {"type": "message_start", "message": render.message_body(
                    msg_id, req.model, [], None, None, start_usage)})
                started = True
            for e in blocks.feed(snap["text"], finish is not None):
                for chunk in block_events(e, req.omit_thinking):
                    yield chunk
                if not pinged:
                    yield _event("ping", {"type": "ping"})
                    pinged = True
            if finish is not None:
                stop_reason, stop_sequence = render.stop_info(finish, req.stop_sequences, blocks.called)
                yield _event("message_delta", {"type": "message_delta",
                                               "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                               "usage": render.usage(meta)})
                yield _event("message_stop", {"type": "message_stop"})
    except RuntimeDead as e:
        yield _event("error", error_body(str(e), 503, ApiFlavor.ANTHROPIC))
    except ApiError as e:
        yield _event("error", error_body(str(e), e.status_code, ApiFlavor.ANTHROPIC))

