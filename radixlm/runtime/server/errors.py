"""Error responses in the OpenAI shape SGLang uses: {object, message, type, param, code}."""
from __future__ import annotations

import orjson
from fastapi.responses import Response


class BadRequest(Exception):
    """Invalid client input: always HTTP 400, never reaches the scheduler."""


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def error_response(message: str, status_code: int = 400, err_type: str = "BadRequestError") -> Response:
    return Response(orjson.dumps(error_body(message, err_type, status_code)), status_code=status_code, media_type="application/json")
