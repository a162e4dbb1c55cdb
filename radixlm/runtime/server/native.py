"""The native /generate endpoint: same request fields and response shape as Engine.generate;
stream=true answers with SSE chunks carrying the cumulative text (or, with --incremental-streaming-output,
only what is new), then `data: [DONE]`."""
from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from radixlm.runtime.errors import ApiError
from radixlm.runtime.front import bootstrap_info
from radixlm.runtime.server.errors import BadRequest, error_body, parse
from radixlm.runtime.server.native_protocol import GenerateReqInput
from radixlm.runtime.server.openapi import request_body
from radixlm.runtime.tokenizer_manager import RuntimeDead

router = APIRouter()

DISCONNECT_POLL_S = 0.5


async def read_json_object(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status_code, media_type="application/json")


@router.post("/generate", openapi_extra=request_body(GenerateReqInput))
@router.put("/generate", openapi_extra=request_body(GenerateReqInput))
async def generate(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: GenerateReqInput = parse(GenerateReqInput, await read_json_object(request))
    try:
        built = await tm.build_async(
            prompt=req.text, sampling_params=req.sampling_dicts(), input_ids=req.input_ids,
            return_logprob=req.return_logprob, logprob_start_len=req.logprob_start_len,
            top_logprobs_num=req.top_logprobs_num, rid=req.rid, extra_key=req.extra_key, stream=req.stream,
            image_data=req.image_data, video_data=req.video_data, lora_path=req.lora_path, priority=req.priority,
            timeout_s=req.timeout_s,
            bootstrap=bootstrap_info(req.bootstrap_host, req.bootstrap_port, req.bootstrap_room))
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e)) from None
    if req.stream:
        incremental = tm.server_args.incremental_streaming_output
        return StreamingResponse(_sse(tm, built.msgs[0], req.return_text_in_logprobs, incremental),
                                 media_type="text/event-stream")
    try:
        return json_response(await generate_or_abort(request, tm, built, req.return_text_in_logprobs))
    except ClientDisconnected:
        return Response(status_code=499)
    except ValueError as e:
        raise BadRequest(str(e)) from None


class ClientDisconnected(Exception):
    """The HTTP client went away before its (non-streaming) requests finished; they were aborted."""


async def generate_or_abort(request: Request, tm, built, return_text: bool):
    """tm.generate, but a client that goes away cancels its requests, so their KV is freed."""
    task = asyncio.ensure_future(tm.generate(built, return_text))
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            raise ClientDisconnected()
    return task.result()


class StreamDelta:
    """Turns cumulative snapshots into increments: new text, new output ids and new logprob entries."""

    LISTS = ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs")

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    def _cut(self, key: str, seq):
        start = self.sent.get(key, 0)
        self.sent[key] = len(seq)
        return seq[start:]

    def __call__(self, snap: dict) -> dict:
        meta = dict(snap["meta_info"])
        for key in self.LISTS:
            if key in meta:
                meta[key] = self._cut(key, meta[key])
        return {**snap, "text": self._cut("text", snap["text"]), "output_ids": self._cut("ids", snap["output_ids"]),
                "meta_info": meta}


async def _sse(tm, msg, return_text: bool, incremental: bool):
    delta = StreamDelta() if incremental else None
    try:
        async for snap in tm.generate_stream(msg, return_text):
            yield b"data: " + orjson.dumps(delta(snap) if delta else snap) + b"\n\n"
    except RuntimeDead as e:
        yield b"data: " + orjson.dumps({"error": error_body(str(e), 503)}) + b"\n\n"
    except ApiError as e:
        yield b"data: " + orjson.dumps({"error": error_body(str(e), e.status_code)}) + b"\n\n"
    yield b"data: [DONE]\n\n"
