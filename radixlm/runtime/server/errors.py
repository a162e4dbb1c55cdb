"""Error responses in the OpenAI shape SGLang uses: {object, message, type, param, code}."""
from __future__ import annotations

import re
from typing import Any

import orjson
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError


class BadRequest(Exception):
    """Invalid client input: always HTTP 400, never reaches the scheduler."""


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def error_response(message: str, status_code: int = 400, err_type: str = "BadRequestError") -> Response:
    return Response(orjson.dumps(error_body(message, err_type, status_code)), status_code=status_code, media_type="application/json")


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
