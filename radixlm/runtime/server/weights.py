"""SGLang's weight-update and memory routes: /update_weights_from_disk, /init_weights_update_group,
/update_weights_from_distributed, /destroy_weights_update_group, /release_memory_occupation,
/resume_memory_occupation, /get_weight_version. Each answers {"success", "message", ...}: 200, or 400 when the
scheduler refused it (nothing changed; a refused update keeps the old weights serving), in the native error shape
with those fields beside it. Updates from tensors are the offline Engine's (update_weights_from_tensor)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr

from radixlm.runtime import messages
from radixlm.runtime.server.errors import error_body, parse
from radixlm.runtime.server.native import json_response, read_json_object
from radixlm.runtime.server.openapi import integer, request_body

router = APIRouter()

Port = integer(ge=1, le=65535)
NonNegative = integer(ge=0)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WeightsReqOutput(BaseModel):
    """The answer of every route here (SGLang's fields, and the weight version after the call)."""

    success: bool
    message: str
    weight_version: str
    num_paused_requests: int


_RESPONSES = {200: {"model": WeightsReqOutput, "description": "Done"}}


class UpdateWeightFromDiskReqInput(_Body):
    model_path: StrictStr
    load_format: StrictStr | None = None
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    flush_cache: StrictBool = True


class InitWeightsUpdateGroupReqInput(_Body):
    master_address: StrictStr
    master_port: Port
    rank_offset: integer(ge=1)
    world_size: integer(ge=2)
    group_name: StrictStr = "weight_update_group"
    backend: StrictStr = "nccl"


class UpdateWeightsFromDistributedReqInput(_Body):
    names: list[StrictStr]
    dtypes: list[StrictStr]
    shapes: list[list[NonNegative]]
    group_name: StrictStr = "weight_update_group"
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    load_format: StrictStr | None = None


class DestroyWeightsUpdateGroupReqInput(_Body):
    group_name: StrictStr = "weight_update_group"


class MemoryOccupationReqInput(_Body):
    tags: list[StrictStr] | None = None  # "kv_cache", "weights"; unset: both


async def _run(request: Request, model: type[_Body], message_type: type) -> Response:
    tm = request.app.state.tokenizer_manager
    body = parse(model, await read_json_object(request))
    out = await tm.weights_request(message_type(**body.model_dump()))
    answer = {"success": out.success, "message": out.message, "weight_version": out.weight_version,
              "num_paused_requests": out.num_paused_requests}
    if out.success:
        return json_response(answer)
    # The native error shape with SGLang's fields beside it: a 400 is an error like any other route's.
    return json_response({**error_body(out.message, 400), **answer}, 400)


def _route(path: str, model: type[_Body], message_type: type) -> None:
    async def endpoint(request: Request) -> Response:
        return await _run(request, model, message_type)

    endpoint.__name__ = path.strip("/")
    router.post(path, openapi_extra=request_body(model), responses=_RESPONSES)(endpoint)


_route("/update_weights_from_disk", UpdateWeightFromDiskReqInput, messages.UpdateWeightFromDiskReqInput)
_route("/init_weights_update_group", InitWeightsUpdateGroupReqInput, messages.InitWeightsUpdateGroupReqInput)
_route("/update_weights_from_distributed", UpdateWeightsFromDistributedReqInput,
       messages.UpdateWeightsFromDistributedReqInput)
_route("/destroy_weights_update_group", DestroyWeightsUpdateGroupReqInput, messages.DestroyWeightsUpdateGroupReqInput)
_route("/release_memory_occupation", MemoryOccupationReqInput, messages.ReleaseMemoryOccupationReqInput)
_route("/resume_memory_occupation", MemoryOccupationReqInput, messages.ResumeMemoryOccupationReqInput)


@router.get("/get_weight_version")
async def get_weight_version(request: Request) -> Response:
    return json_response({"weight_version": request.app.state.tokenizer_manager.weight_version})

