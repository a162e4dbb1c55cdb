"""The OpenAPI document without a server: every status code the server answers is stated, each error in its
API's shape; the request schemas state the bounds the server enforces, and accept integral floats for
integers as JSON Schema does."""
from __future__ import annotations

from types import SimpleNamespace

import jsonschema
import pytest

from radixlm.runtime.front import FrontLimits, RequestBuilder
from radixlm.runtime.server import anthropic_protocol
from radixlm.runtime.server.errors import ApiFlavor, BadRequest, error_body, error_response, flavor_of, parse
from radixlm.runtime.server.guard import GENERATION_PATHS
from radixlm.runtime.server.http_app import create_app
from radixlm.runtime.server.native_protocol import GenerateReqInput, SamplingParamsInput
from radixlm.runtime.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixlm.runtime.server.openapi import AnthropicError, NativeError, OpenAIError

VOCAB = 1000
LIMITS = FrontLimits(vocab_size=VOCAB, context_len=512, max_total_num_tokens=4096, max_logprobs=20)
ERROR_MODELS = {ApiFlavor.NATIVE: NativeError, ApiFlavor.OPENAI: OpenAIError, ApiFlavor.ANTHROPIC: AnthropicError}


@pytest.fixture(scope="module")
def doc() -> dict:
    tm = SimpleNamespace(server_args=SimpleNamespace(model_path="default", responses_store_size=4),
                         builder=SimpleNamespace(limits=LIMITS))
    return create_app(tm).openapi()


def operations(doc):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield path, method, op


def validator(doc, model: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{model}", "components": doc["components"]})


def test_every_operation_states_the_status_codes_the_server_answers(doc):
    for path, method, op in operations(doc):
        codes = set(op["responses"])
        name = f"{method.upper()} {path}"
        assert "422" not in codes and {"200", "405"} <= codes, name
        assert ("401" in codes) == (not path.startswith(("/health", "/metrics"))), name
        assert ("400" in codes) == ("requestBody" in op or bool(op.get("parameters")) or path == "/flush_cache"), name
        assert ("404" in codes) == (path in ("/v1/models/{model}", "/v1/responses", "/v1/responses/{response_id}")), name
        assert ("499" in codes) == ("500" in codes) == (path in GENERATION_PATHS), name
        if path in GENERATION_PATHS:
            assert {"application/json", "text/event-stream"} <= set(op["responses"]["200"]["content"]), name
            assert "503" in codes, name
        if "503" in codes:
            assert op["responses"]["503"]["headers"]["Retry-After"]["required"], name
        error = {"$ref": f"#/components/schemas/{ERROR_MODELS[flavor_of(path)].__name__}"}
        for code, response in op["responses"].items():
            json_body = response.get("content", {}).get("application/json")
            if code >= "400" and json_body is not None:
                assert json_body["schema"] == error, (name, code)
    assert not {"HTTPValidationError", "ValidationError"} & set(doc["components"]["schemas"])


@pytest.mark.parametrize("flavor", list(ApiFlavor))
@pytest.mark.parametrize("status", [400, 401, 404, 405, 500, 503])
def test_error_bodies_have_the_documented_shape(doc, flavor, status):
    body = error_body("bad", status, flavor)
    ERROR_MODELS[flavor].model_validate(body)
    validator(doc, ERROR_MODELS[flavor].__name__).validate(body)
    for other in set(ApiFlavor) - {flavor}:
        assert not validator(doc, ERROR_MODELS[other].__name__).is_valid(body), (flavor, other)
    assert ("retry-after" in error_response("busy", status, flavor).headers) == (status == 503)


def test_runtime_limits_are_resolved(doc):
    assert "x-radixlm-limit" not in str(doc)
    generate = doc["components"]["schemas"]["GenerateReqInput"]["properties"]
    assert generate["top_logprobs_num"]["anyOf"][0]["maximum"] == 20
    assert generate["input_ids"]["anyOf"][0]["items"]["maximum"] == VOCAB - 1
    assert doc["paths"]["/v1/models/{model}"]["get"]["parameters"][0]["example"] == "default"


@pytest.mark.parametrize("model,body,valid", [
    ("ChatCompletionRequest", {"messages": []}, False),
    ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, False),
    ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, False),
    ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2,
                               "logprobs": True, "max_tokens": 2.0}, True),
    ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}], "regex": "a", "ebnf": "b"}, False),
    ("CompletionRequest", {"prompt": []}, False),
    ("CompletionRequest", {"prompt": ""}, False),
    ("CompletionRequest", {"prompt": [[]]}, False),
    ("CompletionRequest", {"prompt": [1, 2], "n": 129}, False),
    ("CompletionRequest", {"prompt": [1.0, 2.0], "n": 2.0, "regex": "a", "ebnf": None}, True),
    ("GenerateReqInput", {"text": "hi", "input_ids": [1]}, False),
    ("GenerateReqInput", {"sampling_params": {"max_new_tokens": 1}}, False),
    ("GenerateReqInput", {"text": "hi", "input_ids": None, "sampling_params": {"seed": 1, "sampling_seed": 2}}, False),
    ("GenerateReqInput", {"text": "hi", "sampling_params": {"top_k": 0}}, False),
    ("GenerateReqInput", {"input_ids": [1, VOCAB - 1], "sampling_params": {"top_k": -1, "stop": ["a"] * 64}}, True),
    ("GenerateReqInput", {"input_ids": [VOCAB]}, False),
    ("GenerateReqInput", {"text": "hi", "sampling_params": {"logit_bias": {"x": 1}}}, False),
    ("MessagesRequest", {"model": "m", "max_tokens": 1, "messages": []}, False),
    ("MessagesRequest", {"model": "m", "max_tokens": 1, "messages": [{"role": "assistant", "content": "hi"}]}, False),
    ("MessagesRequest", {"model": "m", "max_tokens": 1.0, "messages": [{"role": "user", "content": "hi"},
                                                                       {"role": "assistant", "content": "a"}]}, True),
    ("ResponsesRequest", {"input": "hi", "max_output_tokens": 0}, False),
    ("ResponsesRequest", {"input": [{"type": "web_search_call", "id": "x"}]}, False),
    ("ResponsesRequest", {"input": [{"role": "user", "content": "hi"}, {"type": "function_call_output",
                                                                       "call_id": "c", "output": "x"}],
                          "max_output_tokens": 2.0, "tool_choice": {"type": "function", "name": "f"}}, True),
    ("MessagesRequest", {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                         "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                         "tool_choice": {"type": "tool", "name": "f"}}, True),
    ("MessagesRequest", {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                         "tool_choice": {"type": "tool"}}, False),
    ("AbortReq", {}, False),
    ("AbortReq", {"rid": ""}, False),
    ("AbortReq", {"abort_all": True}, True),
])
def test_request_schemas_state_what_the_server_refuses(doc, model, body, valid):
    assert validator(doc, model).is_valid(body) == valid


def test_integers_may_arrive_as_integral_floats():
    req = parse(GenerateReqInput, {"input_ids": [1.0, 2], "top_logprobs_num": 3.0,
                                   "sampling_params": {"n": 2.0, "max_new_tokens": 8.0, "stop_token_ids": [5.0]}})
    assert req.input_ids == [1, 2] and req.top_logprobs_num == 3
    assert req.sampling_dicts() == {"n": 2, "max_new_tokens": 8, "stop_token_ids": [5]}
    assert all(type(v) is int for v in (*req.input_ids, req.top_logprobs_num))
    assert parse(CompletionRequest, {"prompt": [[1.0], [2.0]], "max_tokens": 0.0}).prompt == [[1], [2]]
    assert parse(ChatCompletionRequest, {"messages": [{"role": "user"}], "seed": -3.0}).seed == -3
    raw = b'{"model": "m", "max_tokens": 8.0, "top_k": 1.0, "messages": [{"role": "user", "content": "hi"}]}'
    assert anthropic_protocol.parse(anthropic_protocol.MessagesRequest, raw).max_tokens == 8
    for bad in (2.5, True, "2", 1e300, float("inf")):
        with pytest.raises(BadRequest):
            parse(GenerateReqInput, {"text": "hi", "sampling_params": {"n": bad}})
    with pytest.raises(BadRequest, match="max_tokens"):
        anthropic_protocol.parse(anthropic_protocol.MessagesRequest,
                                 b'{"model": "m", "max_tokens": 0.0, "messages": [{"role": "user", "content": "hi"}]}')


class _TagTokenizer:
    """Enough of a tokenizer for a reasoning family's tags (a thinking budget's)."""

    def encode(self, text, add_special_tokens=True):
        return [len(text)]


def _accepted(name: str, value) -> bool:
    sp = {"max_new_tokens": 4, name: value}
    builder = (RequestBuilder(_TagTokenizer(), LIMITS, reasoning_parser="deepseek-r1") if name == "thinking_budget"
               else RequestBuilder(None, LIMITS))
    try:
        builder.build(input_ids=[1, 2, 3], sampling_params=sp)
    except ValueError:
        return False
    return True


def _number_branch(prop: dict) -> dict:
    return next(s for s in prop["anyOf"] if s.get("type") in ("integer", "number"))


@pytest.mark.parametrize("name", [n for n, p in SamplingParamsInput.model_json_schema()["properties"].items()
                                  if any(s.get("type") in ("integer", "number") for s in p.get("anyOf", ()))])
def test_documented_sampling_bounds_are_the_enforced_ones(name):
    schema = _number_branch(SamplingParamsInput.model_json_schema()["properties"][name])
    step = 1 if schema["type"] == "integer" else 1e-6
    inside_outside = []
    if "minimum" in schema:
        inside_outside.append((schema["minimum"], schema["minimum"] - step))
    if "exclusiveMinimum" in schema:
        inside_outside.append((schema["exclusiveMinimum"] + step, schema["exclusiveMinimum"]))
    if "maximum" in schema:
        inside_outside.append((schema["maximum"], schema["maximum"] + step))
    for inside, outside in inside_outside:
        assert _accepted(name, inside), (name, inside)
        assert not _accepted(name, outside), (name, outside)
    if "not" in schema:
        assert not _accepted(name, schema["not"]["const"])


def test_documented_front_limits_are_the_enforced_ones():
    stops = SamplingParamsInput.model_json_schema()["properties"]["stop"]["anyOf"]
    max_items, max_len = stops[1]["maxItems"], stops[0]["maxLength"]
    assert _accepted("stop", ["a"] * max_items) and not _accepted("stop", ["a"] * (max_items + 1))
    assert _accepted("stop", "a" * max_len) and not _accepted("stop", "a" * (max_len + 1))
    builder = RequestBuilder(None, LIMITS)
    builder.build(input_ids=[1, 2], return_logprob=True, top_logprobs_num=LIMITS.max_top_logprobs)
    with pytest.raises(ValueError):
        builder.build(input_ids=[1, 2], return_logprob=True, top_logprobs_num=LIMITS.max_top_logprobs + 1)
    with pytest.raises(ValueError):
        builder.build(input_ids=[1, 2], logprob_start_len=-2)
