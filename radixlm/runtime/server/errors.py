"""Error responses, each API in its own shape: the native routes in SGLang's flat shape
{object: "error", message, type, param, code}, the OpenAI routes in OpenAI's {error: {message, type, param, code}},
the Anthropic routes in Anthropic's {type: "error", error: {type, message}}. Which API a route belongs to follows
from its path, so middleware, exception handlers and the router answer alike."""
from __future__ import annotations

import enum
import re
from typing import Any

import orjson
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from radixlm.runtime.errors import ApiError

RETRY_AFTER_S = 1  # what a 503 asks clients to wait before they try again


class ApiFlavor(enum.Enum):
    NATIVE = "native"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


def flavor_of(path: str) -> ApiFlavor:
    if path.startswith("/v1/messages"):
        return ApiFlavor.ANTHROPIC
    if path.startswith("/v1/"):
        return ApiFlavor.OPENAI
    return ApiFlavor.NATIVE


class BadRequest(ApiError):
    """Invalid client input: always HTTP 400, never reaches the scheduler."""

    status_code = 400


class NotFound(ApiError):
    """An id the server does not hold (a stored response): 404."""

    status_code = 404


class Unavailable(ApiError):
    """The server cannot take the request now (starting, busy, or its pipeline is down): 503 with Retry-After."""

    status_code = 503


_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
          405: "MethodNotAllowedError", 409: "ConflictError", 413: "RequestTooLargeError", 422: "BadRequestError",
          499: "ClientClosedRequest", 500: "InternalServerError", 502: "BadGatewayError",
          503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 409: "invalid_request_error",
                    413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error",
                    503: "overloaded_error", 529: "overloaded_error"}


def error_body(message: str, status_code: int = 400, flavor: ApiFlavor = ApiFlavor.NATIVE,
               err_type: str | None = None, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    if flavor is ApiFlavor.ANTHROPIC:
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status_code, "api_error"), "message": message}}
    inner = {"message": message, "type": err_type or _TYPES.get(status_code, "InternalServerError"), "param": param,
             "code": status_code if code is None else code}
    return {"error": inner} if flavor is ApiFlavor.OPENAI else {"object": "error", **inner}


def error_response(message: str, status_code: int = 400, flavor: ApiFlavor = ApiFlavor.NATIVE,
                   err_type: str | None = None, param: str | None = None, code: str | int | None = None) -> Response:
    """A JSON error response; a 503 carries Retry-After (the server is alive but cannot take the request now)."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status_code == 503 else None
    return Response(orjson.dumps(error_body(message, status_code, flavor, err_type, param, code)),
                    status_code=status_code, media_type="application/json", headers=headers)


# Union members add their type to an error's location (`str`, `list[int]`, `SamplingParamsInput`); field names
# are snake_case.
_TYPE_TAG = re.compile(r"^(str|int|float|bool|dict|list|none)$|[\[\]]|^[A-Z]\w*$")


def parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """Validates a request body; a type error becomes a 400 naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        errors = e.errors()
        root = errors[0]["loc"][0] if errors[0]["loc"] else "body"
        mine = [err for err in errors if err["loc"] and err["loc"][0] == root]
        locs = [[p for p in err["loc"] if isinstance(p, int) or not _TYPE_TAG.search(p)] for err in mine]
        deepest = max(len(loc) for loc in locs)
        at_deepest = [i for i, loc in enumerate(locs) if len(loc) == deepest]
        # One error, or one union member that got furthest into the value (the branch the client meant).
        if len(mine) == 1 or (deepest > 1 and len(at_deepest) == 1):
            i = at_deepest[0]
            raise BadRequest(f"{'.'.join(map(str, locs[i]))}: {mine[i]['msg']}") from None
        msgs = "; ".join(dict.fromkeys(err["msg"] for err in mine))
        raise BadRequest(f"{root}: invalid value {str(body.get(root))[:100]!r} ({msgs})") from None
