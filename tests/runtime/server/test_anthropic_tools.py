"""Tool use on the Anthropic Messages API, driven by the real `anthropic` SDK against the shared server: a forced
call (tool_choice tool / any) plain and streamed, a tool_result follow-up, and bad tool input."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

WEATHER = {"name": "weather", "description": "Get the weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                            "additionalProperties": False}}
# No arguments: the streamed call is short (the plain one checks arguments).
NOW = {"name": "now", "description": "Get the time", "input_schema": {"type": "object", "properties": {},
                                                                      "additionalProperties": False}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"model": "default", "max_tokens": 64, "extra_body": {"temperature": 0}}


def test_tool_use_plain_streamed_and_result(server, anthropic_client, tokenizer):
    msg = anthropic_client.messages.create(messages=USER, tools=[WEATHER],
                                           tool_choice={"type": "tool", "name": "weather"}, **GREEDY)
    assert msg.stop_reason == "tool_use" and msg.stop_sequence is None
    [use] = msg.content
    assert use.type == "tool_use" and use.name == "weather" and use.id.startswith("toolu_")
    assert "paris" in use.input["city"].lower()

    with anthropic_client.messages.stream(messages=USER, tools=[NOW],
                                          tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                          **GREEDY) as stream:
        events = [e for e in stream if e.type not in ("input_json", "text")]  # the SDK's own, derived events
        final = stream.get_final_message()
    types = [e.type for e in events]
    assert types[:2] == ["message_start", "content_block_start"]
    assert set(types[2:-3]) == {"content_block_delta"}
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[1].content_block
    assert start.type == "tool_use" and start.name == "now" and start.input == {}
    assert {e.delta.type for e in events[2:-3]} == {"input_json_delta"}
    assert json.loads("".join(e.delta.partial_json for e in events[2:-3])) == {}
    assert events[-2].delta.stop_reason == "tool_use"
    assert final.stop_reason == "tool_use" and final.content[0].input == {} and final.content[0].id == start.id

    # The call and its result reach the chat template as an assistant turn with tool_calls and a tool message.
    convo = USER + [{"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    follow = anthropic_client.messages.create(messages=convo, tools=[WEATHER], **dict(GREEDY, max_tokens=1))
    assert follow.content[0].type == "text" and follow.stop_reason == "max_tokens"
    chat = [USER[0], {"role": "assistant", "content": "", "tool_calls": [
                {"id": use.id, "type": "function", "function": {"name": "weather", "arguments": use.input}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": use.id, "name": "weather"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    expected = len(tokenizer.encode(text, add_special_tokens=False))
    assert follow.usage.input_tokens + follow.usage.cache_read_input_tokens == expected
    counted = anthropic_client.messages.count_tokens(model="default", messages=convo, tools=[WEATHER])
    assert counted.input_tokens == expected


TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}


@pytest.mark.parametrize("bad", [
    {"tools": [{"name": "weather", "input_schema": {"type": "string"}}]},
    {"tools": [{"type": "bash_20250124", "name": "bash"}]},
    {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
    {"tool_choice": {"type": "any"}},
    {"tools": [WEATHER, WEATHER]},
    {"tools": [{**WEATHER, "name": "bad name"}]},
    {"messages": USER + [{"role": "assistant", "content": [TOOL_USE]}]},
    {"messages": [{"role": "user", "content": [TOOL_USE]}]},
    {"messages": USER + [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]},
])
def test_bad_tool_input_is_400(server, bad):
    r = server.client.post("/v1/messages", json={"model": "default", "max_tokens": 4, "messages": USER, **bad})
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
