"""Tool calling on /v1/chat/completions, driven through the `openai` SDK against a live Qwen2.5 server."""
from __future__ import annotations

import json

import openai
import pytest

from radixlm.runtime.model_loader.tokenizer import get_tokenizer
from tests.runtime.server.conftest import start_server, stop_server

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-0.5b"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city name"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
TOOLS = [WEATHER, TIME]
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
SAY_HELLO = [{"role": "user", "content": "Say hello to me."}]


@pytest.fixture(scope="module")
def server():
    h = start_server("--model-path", MODEL, "--max-total-tokens", "4096")
    yield h
    stop_server(h)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    yield c
    c.close()


def create(client, messages, **kw):
    kw.setdefault("max_tokens", 64)
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def collect(client, messages, **kw) -> tuple[str, list[dict], str, list]:
    """Streams; returns (content, calls assembled from the deltas, last finish_reason, every tool-call delta)."""
    content, calls, reason, deltas = "", [], None, []
    for chunk in create(client, messages, stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            deltas.append(d)
            if d.id is not None:
                assert d.index == len(calls) and d.type == "function" and d.function.arguments == ""
                calls.append({"id": d.id, "name": d.function.name, "arguments": ""})
            else:
                assert d.function.name is None and d.type is None
                calls[d.index]["arguments"] += d.function.arguments
        reason = ch.finish_reason or reason
    return content, calls, reason, deltas


def as_pairs(tool_calls) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in tool_calls]


def test_auto_calls_the_tool_and_streams_the_same(client):
    r = create(client, ASK_WEATHER, tools=TOOLS)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch.message.content
    call = ch.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["city"].lower()
    assert ch.message.content is None or "<tool_call>" not in ch.message.content

    content, calls, reason, deltas = collect(client, ASK_WEATHER, tools=TOOLS)
    assert reason == "tool_calls" and "<tool_call" not in content
    assert [(c["name"], c["arguments"]) for c in calls] == as_pairs(ch.message.tool_calls)
    assert len(deltas) > len(calls)  # arguments came in fragments after each call's first delta
    assert (content or None) == ch.message.content


def test_required_forces_a_call(client):
    r = create(client, SAY_HELLO, tools=TOOLS, tool_choice="required")
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    for call in ch.message.tool_calls:
        args = json.loads(call.function.arguments)
        key = {"get_weather": "city", "get_time": "timezone"}[call.function.name]
        assert isinstance(args[key], str)


def test_named_function_is_called_streamed_and_not(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = create(client, ASK_WEATHER, tools=TOOLS, tool_choice=choice)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and [c.function.name for c in ch.message.tool_calls] == ["get_time"]
    assert isinstance(json.loads(ch.message.tool_calls[0].function.arguments)["timezone"], str)
    content, calls, reason, _ = collect(client, ASK_WEATHER, tools=TOOLS, tool_choice=choice)
    assert reason == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == as_pairs(ch.message.tool_calls)


def test_parallel_tool_calls_false_makes_one_call(client):
    ask_both = [{"role": "user", "content": "What is the weather in Paris, and the time in Tokyo?"}]
    r = create(client, ask_both, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1 and ch.message.content is None


def test_none_does_not_offer_the_tools(client):
    r = create(client, ASK_WEATHER, tools=TOOLS, tool_choice="none", max_tokens=4)
    with_tools = create(client, ASK_WEATHER, tools=TOOLS, max_tokens=1)
    plain = create(client, ASK_WEATHER, max_tokens=1)
    ch = r.choices[0]
    assert ch.message.tool_calls is None and ch.finish_reason in ("stop", "length") and ch.message.content
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens < with_tools.usage.prompt_tokens


def test_multi_turn_with_a_tool_result(client):
    messages = [
        *ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 22 degrees Celsius."},
    ]
    r = create(client, messages, tools=TOOLS, max_tokens=8)  # the prompt is under test, not the answer's length
    tok = get_tokenizer(MODEL)
    templated = [*messages[:1], {**messages[1], "content": "", "tool_calls": [
        {**messages[1]["tool_calls"][0], "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        messages[2]]
    text = tok.apply_chat_template(templated, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<tool_response>\nSunny, 22 degrees Celsius.\n</tool_response>" in text
    assert '"arguments": {"city": "Paris"}' in text
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
    ch = r.choices[0]
    assert ch.message.content and ch.finish_reason in ("stop", "length")


@pytest.mark.parametrize("kw,needle", [
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "invalid function name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}, "not among the tools"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "non-empty tools"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}],
      "tool_choice": "required"}, "tools.1.function.parameters: invalid json_schema"),
])
def test_invalid_tools_are_400(client, kw, needle):
    with pytest.raises(openai.BadRequestError) as e:
        create(client, ASK_WEATHER, max_tokens=1, **kw)
    assert needle in e.value.body["message"]
