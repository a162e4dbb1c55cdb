"""Anthropic Messages API: POST /v1/messages (plain and SSE-streamed, with tools) and /v1/messages/count_tokens.
A request is translated into a chat request and runs through the chat pipeline (prepare_chat); its output is read
into blocks (output_blocks): text and tool_use content blocks.
Errors answer in Anthropic's shape {type: "error", error: {type, message}} (the app's handlers pick it by path);
an operator's abort is a normal end with stop_reason "abort", as the other APIs finish with "abort"."""
from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from radixlm.runtime.server import anthropic_protocol as proto
from radixlm.runtime.errors import ApiError
from radixlm.runtime.server.errors import ApiFlavor, error_body
from radixlm.runtime.server.native import ClientDisconnected, json_response
from radixlm.runtime.server.openai.chat import chat_prompt_ids, prepare_chat
from radixlm.runtime.server.openai.common import merged_stream, run
from radixlm.runtime.server.openai.tool_calls import ToolPlan, plan_tools
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
    ids = chat_prompt_ids(tm, chat.messages, chat.continue_final_message, None, plan.template_tools)
    images = sum(len(m.image_urls()) for m in chat.messages)
    return json_response({"input_tokens": len(ids) + tm.builder.media_token_count(images)})


@router.post("/v1/messages", openapi_extra=request_body(proto.MessagesRequest))
async def messages(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    msg_id = proto.new_message_id()
    req: proto.MessagesRequest = proto.parse(proto.MessagesRequest, await request.body())
    # prepare_chat runs the model's LoRA adapter, if it names one (or base:adapter), as on the OpenAI routes.
    built, plan = await prepare_chat(tm, req.chat_request(msg_id))
    if tm.dead is not None:
        raise RuntimeDead(tm.dead)
    if req.stream:
        return StreamingResponse(_events(tm, built, plan, req, msg_id), media_type="text/event-stream")
    try:
        out = (await run(request, tm, built))[0]
    except ClientDisconnected:
        return Response(status_code=499)
    meta = out["meta_info"]
    blocks = final_blocks(plan, out["text"])
    called = any(b.kind is BlockKind.TOOL_CALL for b in blocks)
    stop_reason, stop_sequence = proto.stop_info(meta["finish_reason"], req.stop_sequences, called)
    content = [proto.content_block(b) for b in blocks]
    return json_response(proto.message_body(msg_id, req.model, content, stop_reason, stop_sequence, proto.usage(meta)))


def _event(name: str, data: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def block_event(e: BlockEvent) -> bytes:
    if e.type is EventType.START:
        return _event("content_block_start", {"type": "content_block_start", "index": e.index,
                                              "content_block": proto.content_block(e.block, streaming=True)})
    if e.type is EventType.DELTA:
        return _event("content_block_delta", {"type": "content_block_delta", "index": e.index,
                                              "delta": proto.block_delta(e.block)})
    return _event("content_block_stop", {"type": "content_block_stop", "index": e.index})


async def _events(tm, built, plan: ToolPlan, req: proto.MessagesRequest, msg_id: str) -> AsyncIterator[bytes]:
    blocks = BlockStream(plan)
    started = pinged = False
    try:
        async for _, snap in merged_stream(tm, built):
            meta = snap["meta_info"]
            finish = meta["finish_reason"]
            if not started:
                # Sent with the first snapshot, so its usage counts the cached prompt tokens correctly.
                start_usage = dict(proto.usage(meta), output_tokens=0)
                yield _event("message_start", {"type": "message_start", "message": proto.message_body(
                    msg_id, req.model, [], None, None, start_usage)})
                started = True
            for e in blocks.feed(snap["text"], finish is not None):
                yield block_event(e)
                if not pinged:
                    yield _event("ping", {"type": "ping"})
                    pinged = True
            if finish is not None:
                stop_reason, stop_sequence = proto.stop_info(finish, req.stop_sequences, blocks.called)
                yield _event("message_delta", {"type": "message_delta",
                                               "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                               "usage": proto.usage(meta)})
                yield _event("message_stop", {"type": "message_stop"})
    except RuntimeDead as e:
        yield _event("error", error_body(str(e), 503, ApiFlavor.ANTHROPIC))
    except ApiError as e:
        yield _event("error", error_body(str(e), e.status_code, ApiFlavor.ANTHROPIC))

