"""The OpenAPI document. Routes parse their own JSON bodies (each API answers errors in its own shape), so
FastAPI cannot see their request models: a route passes `openapi_extra=request_body(Model)`, and
`install_openapi` moves the models' schemas into the document's components and states every status code the
server answers, each error in its API's shape (errors.flavor_of).

Also the field types the request models share: `Int` (an integer that may arrive as an integral float, as JSON
Schema's "integer" allows), `Number`, and `Doc`, which states bounds in the document that the server checks
elsewhere (SamplingParams.verify, RequestBuilder), so that their error messages stay the same in every API."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, BeforeValidator, Field, StrictFloat, StrictInt, WithJsonSchema

import radixlm
from radixlm.runtime.server.errors import ApiFlavor, flavor_of
from radixlm.runtime.server.guard import GENERATION_PATHS, OPEN_PREFIXES

_REF = "#/components/schemas/{model}"
_INT64 = 1 << 63


def _integral(v: Any) -> Any:
    # Python's json and JSON Schema both treat 2.0 as an integer; beyond 64 bits it stays a float (and is refused).
    return int(v) if isinstance(v, float) and v.is_integer() and -_INT64 <= v < _INT64 else v


class Doc:
    """JSON Schema keywords for the document only: the value is checked (with the server's own message) after
    parsing. A keyword's value may be a RuntimeLimit, which install_openapi resolves from the running server."""

    def __init__(self, **keywords: Any) -> None:
        self.keywords = keywords

    def __get_pydantic_json_schema__(self, core_schema, handler) -> dict:
        return {**handler(core_schema), **{k: _marker(v) for k, v in self.keywords.items()}}


def present(name: str) -> dict:
    """A schema: the object has the field, not null."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


def at_most_one(*names: str) -> dict:
    """A schema: no two of these fields are both present and not null."""
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    return {"not": {"anyOf": [{"allOf": [present(a), present(b)]} for a, b in pairs]}}


class RuntimeLimit(str):
    """A bound that depends on the server (its vocabulary, --max-logprobs)."""


TOKEN_ID_MAX = RuntimeLimit("token_id_max")
LOGPROBS_MAX = RuntimeLimit("logprobs_max")
_LIMIT_KEY = "x-radixlm-limit"


def _marker(v: Any) -> Any:
    return {_LIMIT_KEY: str(v)} if isinstance(v, RuntimeLimit) else v


def integer(**bounds: Any) -> Any:
    """An int, or a float with an integral value (turned into an int); never a bool or a string. `bounds` (ge,
    le, ...) are enforced by pydantic and stated in the schema. The schema says int64: orjson reads a larger
    integer as a float."""
    return Annotated[StrictInt, Field(**bounds), BeforeValidator(_integral), Doc(format="int64")]


Int = integer()
Number = Annotated[Union[StrictInt, StrictFloat], WithJsonSchema({"type": "number"})]
TokenId = Annotated[Int, Doc(minimum=0, maximum=TOKEN_ID_MAX)]


def request_body(model: type[BaseModel]) -> dict:
    schema = model.model_json_schema(ref_template=_REF)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


class NativeError(BaseModel):
    """SGLang's flat error shape: the routes outside /v1/."""

    object: Literal["error"]
    message: str
    type: str
    param: str | None
    code: int | str | None


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int | str | None


class OpenAIError(BaseModel):
    """The routes under /v1/ except /v1/messages*."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """/v1/messages and /v1/messages/count_tokens."""

    type: Literal["error"]
    error: AnthropicErrorDetail


_ERROR_MODELS = {ApiFlavor.NATIVE: NativeError, ApiFlavor.OPENAI: OpenAIError, ApiFlavor.ANTHROPIC: AnthropicError}

# Routes answered from the tokenizer or static information: they never wait on the scheduler, so never 503.
_LOCAL_PATHS = frozenset({"/model_info", "/get_model_info", "/v1/models", "/v1/models/{model}", "/tokenize",
                          "/v1/tokenize", "/detokenize", "/v1/detokenize", "/v1/messages/count_tokens", "/metrics",
                          "/v1/responses/{response_id}", "/get_weight_version"})
# Answers that are not JSON: Prometheus' text format, and SGLang's plain-text refusal of a flush while busy.
_PLAIN = {"content": {"text/plain": {"schema": {"type": "string"}}}}
_OVERRIDES = {("/metrics", "get", "200"): {"description": "Prometheus text format", **_PLAIN},
              ("/flush_cache", "get", "400"): {"description": "Requests are running or waiting", **_PLAIN},
              ("/flush_cache", "post", "400"): {"description": "Requests are running or waiting", **_PLAIN}}

_DESCRIPTIONS = {
    "400": "Invalid request (malformed JSON, a wrong type or value, a prompt too long for the context)",
    "401": "Missing or wrong API key (when the server runs with --api-key)",
    "404": "Not found",
    "405": "Method not allowed (this path answers other methods)",
    "500": "The request failed while running (an internal error, or the pipeline died under it): not to be retried",
    "503": "Starting, queue full (--max-queued-requests) or the scheduler unavailable; retry after Retry-After",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "required": True,
                                "schema": {"type": "integer"}}}
_ANTHROPIC_EVENTS = ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop", "error"]
_RESPONSES_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                     "response.content_part.done", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed",
                     "response.incomplete", "error"]
# Answer 404 for an id in the body (an unknown previous_response_id) as well as for one in the path.
_NOT_FOUND_PATHS = frozenset({"/v1/responses"})
_CLOSED = {"description": "The client closed the connection before the answer (no body; seen in access logs)"}


def _sse_event(path: str) -> dict:
    """One event of a streamed answer (OpenAPI 3.1: the schema of a text/event-stream describes each event)."""
    if path == "/v1/responses":
        names = _RESPONSES_EVENTS
    else:  # "message": no event field
        names = _ANTHROPIC_EVENTS if flavor_of(path) is ApiFlavor.ANTHROPIC else ["message"]
    return {"type": "object", "required": ["data"],
            "properties": {"data": {"type": "string"}, "event": {"enum": names}}}


def _status_codes(path: str, op: dict) -> list[str]:
    codes = ["405"]
    if "requestBody" in op or op.get("parameters"):
        codes.append("400")
    if not path.startswith(OPEN_PREFIXES):
        codes.append("401")
    if any(p.get("in") == "path" for p in op.get("parameters", ())) or path in _NOT_FOUND_PATHS:
        codes.append("404")
    if path in GENERATION_PATHS:
        codes.append("500")  # tokenizer_manager.RequestFailed: the scheduler ended the request with an error
    if path not in _LOCAL_PATHS:
        codes.append("503")
    return codes


def _add_responses(path: str, method: str, op: dict) -> None:
    responses = op.setdefault("responses", {})
    responses.pop("422", None)  # FastAPI's validation errors: this server answers them with 400
    error = {"$ref": _REF.format(model=_ERROR_MODELS[flavor_of(path)].__name__)}
    for code in _status_codes(path, op):
        responses.setdefault(code, {"description": _DESCRIPTIONS[code],
                                    "content": {"application/json": {"schema": error}}})
    if "503" in responses:
        responses["503"].setdefault("headers", _RETRY_AFTER)
    if path in GENERATION_PATHS:
        responses["200"].setdefault("content", {})["text/event-stream"] = {"schema": _sse_event(path)}
        responses.setdefault("499", _CLOSED)
    for (o_path, o_method, code), response in _OVERRIDES.items():
        if (o_path, o_method) == (path, method):
            responses[code] = response
    op["responses"] = dict(sorted(responses.items()))


def _add_component(components: dict, schema: dict) -> dict:
    """Moves a model's schema (and its $defs) into the components; returns the reference to it."""
    components.update(schema.get("$defs", {}))
    components[schema["title"]] = {k: v for k, v in schema.items() if k != "$defs"}
    return {"$ref": _REF.format(model=schema["title"])}


def _resolve_limits(node: Any, limits: dict[str, int]) -> None:
    """Replaces each RuntimeLimit marker by the server's value (drops the keyword where the server has none)."""
    if isinstance(node, list):
        for item in node:
            _resolve_limits(item, limits)
    elif isinstance(node, dict):
        for key, value in list(node.items()):
            if isinstance(value, dict) and set(value) == {_LIMIT_KEY}:
                if value[_LIMIT_KEY] in limits:
                    node[key] = limits[value[_LIMIT_KEY]]
                else:
                    del node[key]
            else:
                _resolve_limits(value, limits)


def _served(app: FastAPI) -> tuple[dict[str, int], dict[str, str]]:
    """The running server's limits (RuntimeLimit values) and examples of path parameters (the served model)."""
    tm = getattr(app.state, "tokenizer_manager", None)
    if tm is None:
        return {}, {}
    limits = tm.builder.limits
    return ({TOKEN_ID_MAX: limits.vocab_size - 1, LOGPROBS_MAX: limits.max_top_logprobs},
            {"model": tm.server_args.model_path})


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title="radixlm", version=radixlm.__version__, routes=app.routes)
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        for model in _ERROR_MODELS.values():
            _add_component(components, model.model_json_schema(ref_template=_REF))
        limits, path_examples = _served(app)
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
                schema = content.get("schema", {})
                if "$ref" not in schema and "title" in schema:
                    content["schema"] = _add_component(components, schema)
                for param in op.get("parameters", ()):
                    if param["name"] in path_examples:
                        param["example"] = path_examples[param["name"]]
                _add_responses(path, method, op)
        _resolve_limits(components, limits)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
