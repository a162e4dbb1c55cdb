"""POST /load_lora_adapter and /unload_lora_adapter (SGLang's): the answer is SGLang's LoRAUpdateResult
{success, error_message, loaded_adapters}, 200 on success; a failure is a 400 whose body is the native error shape
with those fields too."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixlm.runtime.messages import LoRAUpdateOutput
from radixlm.runtime.server.errors import BadRequest, error_body, parse
from radixlm.runtime.server.native import json_response, read_json_object
from radixlm.runtime.server.native_protocol import LoadLoRAAdapterReq, UnloadLoRAAdapterReq
from radixlm.runtime.server.openapi import request_body

router = APIRouter()


def _answer(out: LoRAUpdateOutput) -> Response:
    result = {"success": out.success, "error_message": out.error_message, "loaded_adapters": out.loaded_adapters}
    if out.success:
        return json_response(result)
    return json_response({**error_body(out.error_message or "failed", 400), **result}, 400)


@router.post("/load_lora_adapter", openapi_extra=request_body(LoadLoRAAdapterReq))
async def load_lora_adapter(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: LoadLoRAAdapterReq = parse(LoadLoRAAdapterReq, await read_json_object(request))
    try:
        return _answer(await tm.load_lora_adapter(req.lora_name, req.lora_path, req.pinned))
    except ValueError as e:
        raise BadRequest(str(e)) from None


@router.post("/unload_lora_adapter", openapi_extra=request_body(UnloadLoRAAdapterReq))
async def unload_lora_adapter(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: UnloadLoRAAdapterReq = parse(UnloadLoRAAdapterReq, await read_json_object(request))
    try:
        return _answer(await tm.unload_lora_adapter(req.lora_name))
    except ValueError as e:
        raise BadRequest(str(e)) from None
