"""Anthropic Messages API: POST /v1/messages (plain and SSE-streamed) and /v1/messages/count_tokens.
Errors answer in Anthropic's shape {type: "error", error: {type, message}} (the app's handlers pick it by path);
an operator's abort is a normal end with stop_reason "abort", as the other APIs finish with "abort"."""
from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from radixlm.runtime.server import anthropic_protocol as proto
from radixlm.runtime.errors import ApiError
from radixlm.runtime.server.errors import BadRequest, ApiFlavor, error_body
from radixlm.runtime.server.native import ClientDisconnected, generate_or_abort, json_response
from radixlm.runtime.server.openapi import request_body
from radixlm.runtime.tokenizer_manager import RuntimeDead

router = APIRouter()


@router.post("/v1/messages/count_tokens", openapi_extra=request_body(proto.Conversation))
async def count_tokens(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    conv = proto.parse(proto.Conversation, await request.body())
    try:
        ids = tm.builder.tokenize(proto.build_prompt(tm.tokenizer, conv, _image_token(tm)), None)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return json_response({"input_tokens": len(ids) + tm.builder.media_token_count(len(proto.images(conv)))})


def _image_token(tm) -> str | None:
    return tm.builder.mm.image_token if tm.builder.mm is not None else None


@router.post("/v1/messages", openapi_extra=request_body(proto.MessagesRequest))
async def messages(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    msg_id = proto.new_message_id()
    req: proto.MessagesRequest = proto.parse(proto.MessagesRequest, await request.body())
    prompt = proto.build_prompt(tm.tokenizer, req, _image_token(tm))
    try:
        # The model may name a LoRA adapter (or base:adapter), as on the OpenAI routes.
        adapter = tm.builder.lora.adapter_of_model(req.model, tm.server_args.model_path)
        built = await tm.build_async(prompt=prompt, sampling_params=req.sampling_params(), stream=req.stream, rid=msg_id,
                                     image_data=proto.images(req) or None, lora_path=adapter)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e)) from None
    if tm.dead is not None:
        raise RuntimeDead(tm.dead)
    if req.stream:
        return StreamingResponse(_events(tm, built.msgs[0], req, msg_id), media_type="text/event-stream")
    try:
        out = await generate_or_abort(request, tm, built, False)
    except ClientDisconnected:
        return Response(status_code=499)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    meta = out["meta_info"]
    stop_reason, stop_sequence = proto.stop_info(meta["finish_reason"], req.stop_sequences)
    return json_response(proto.message_body(msg_id, req.model, [{"type": "text", "text": out["text"]}],
                                            stop_reason, stop_sequence, proto.usage(meta)))


def _event(name: str, data: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def _events(tm, msg, req: proto.MessagesRequest, msg_id: str) -> AsyncIterator[bytes]:
    sent = ""
    started = False
    try:
        async for snap in tm.generate_stream(msg, False):
            meta = snap["meta_info"]
            finish = meta["finish_reason"]
            if not started:
                # Sent with the first snapshot, so its usage counts the cached prompt tokens correctly.
                start_usage = dict(proto.usage(meta), output_tokens=0)
                yield _event("message_start", {"type": "message_start", "message": proto.message_body(
                    msg_id, req.model, [], None, None, start_usage)})
                yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                     "content_block": {"type": "text", "text": ""}})
                yield _event("ping", {"type": "ping"})
                started = True
            text = snap["text"]
            # Snapshots are cumulative; a text that does not extend what was sent cannot be taken back.
            if text.startswith(sent) and len(text) > len(sent):
                yield _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                     "delta": {"type": "text_delta", "text": text[len(sent):]}})
                sent = text
            if finish is not None:
                stop_reason, stop_sequence = proto.stop_info(finish, req.stop_sequences)
                yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
                yield _event("message_delta", {"type": "message_delta",
                                               "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                               "usage": proto.usage(meta)})
                yield _event("message_stop", {"type": "message_stop"})
    except RuntimeDead as e:
        yield _event("error", error_body(str(e), 503, ApiFlavor.ANTHROPIC))
    except ApiError as e:
        yield _event("error", error_body(str(e), e.status_code, ApiFlavor.ANTHROPIC))
