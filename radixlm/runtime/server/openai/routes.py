"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions, /v1/responses (responses.py)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixlm.runtime.server.errors import ApiFlavor, error_response, parse
from radixlm.runtime.server.native import json_response, read_json_object
from radixlm.runtime.server.openai.chat import create_chat_completion
from radixlm.runtime.server.openai.completions import create_completion
from radixlm.runtime.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixlm.runtime.server.openai.responses import router as responses_router
from radixlm.runtime.server.openapi import request_body

router = APIRouter()
router.include_router(responses_router)
_CREATED = int(time.time())


def _card(tm) -> dict:
    name = tm.server_args.model_path
    return {"id": name, "object": "model", "created": _CREATED, "owned_by": "sglang", "root": name, "parent": None,
            "max_model_len": tm.runtime.info.context_len}


def _cards(tm) -> list[dict]:
    """The base model, then each LoRA adapter (SGLang's: root its path, parent the base model)."""
    base = _card(tm)
    adapters = [{**base, "id": ref.lora_name, "root": ref.lora_path, "parent": base["id"]}
                for ref in tm.builder.lora.refs()]
    return [base, *adapters]


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    return json_response({"object": "list", "data": _cards(request.app.state.tokenizer_manager)})


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> Response:
    card = next((c for c in _cards(request.app.state.tokenizer_manager) if c["id"] == model), None)
    if card is None:
        return error_response(f"The model '{model}' does not exist", 404, ApiFlavor.OPENAI, param="model",
                              code="model_not_found")
    return json_response(card)


@router.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
async def completions(request: Request) -> Response:
    return await create_completion(request, parse(CompletionRequest, await read_json_object(request)))


@router.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    return await create_chat_completion(request, parse(ChatCompletionRequest, await read_json_object(request)))
