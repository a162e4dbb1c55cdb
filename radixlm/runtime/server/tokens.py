"""POST /tokenize and /detokenize (and their /v1/ names), as SGLang serves them."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr
from fastapi.responses import Response

from radixlm.runtime.server.errors import BadRequest, parse
from radixlm.runtime.server.native import json_response, read_json_object
from radixlm.runtime.server.openai.chat import chat_prompt_ids
from radixlm.runtime.server.openai.protocol import ChatMessage
from radixlm.runtime.server.openapi import Doc, TokenId, present, request_body

router = APIRouter()


class TokenizeRequest(BaseModel):
    """Exactly one of `prompt` (a string or a batch of them) and `messages` (through the chat template)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [present("prompt"), present("messages")]})

    model: StrictStr | None = None
    prompt: StrictStr | list[StrictStr] | None = None
    messages: Annotated[list[ChatMessage], Doc(minItems=1)] | None = None
    add_special_tokens: StrictBool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    tokens: list[TokenId] | list[list[TokenId]]
    skip_special_tokens: StrictBool = True


@router.post("/tokenize", openapi_extra=request_body(TokenizeRequest))
@router.post("/v1/tokenize", openapi_extra=request_body(TokenizeRequest))
async def tokenize(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: TokenizeRequest = parse(TokenizeRequest, await read_json_object(request))
    if (req.prompt is None) == (req.messages is None):
        raise BadRequest("exactly one of prompt and messages must be given")
    max_len = tm.runtime.info.context_len
    if req.messages is not None:
        ids = chat_prompt_ids(tm, req.messages)
        return json_response({"tokens": ids, "count": len(ids), "max_model_len": max_len})
    batch = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    ids = [tm.tokenizer.encode(p, add_special_tokens=req.add_special_tokens) for p in batch]
    if isinstance(req.prompt, str):
        return json_response({"tokens": ids[0], "count": len(ids[0]), "max_model_len": max_len})
    return json_response({"tokens": ids, "count": [len(x) for x in ids], "max_model_len": max_len})


@router.post("/detokenize", openapi_extra=request_body(DetokenizeRequest))
@router.post("/v1/detokenize", openapi_extra=request_body(DetokenizeRequest))
async def detokenize(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: DetokenizeRequest = parse(DetokenizeRequest, await read_json_object(request))
    batched = bool(req.tokens) and isinstance(req.tokens[0], list)
    batch = req.tokens if batched else [req.tokens]
    vocab = tm.runtime.info.vocab_size
    for ids in batch:
        if not all(0 <= t < vocab for t in ids):
            raise BadRequest(f"tokens: token ids must be in [0, {vocab})")
    texts = [tm.tokenizer.decode(ids, skip_special_tokens=req.skip_special_tokens) for ids in batch]
    return json_response({"text": texts if batched else texts[0]})
