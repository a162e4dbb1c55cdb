"""POST /separate_reasoning and /parse_function_call over the running server: SGLang's shapes, the server's parsers,
400s for unknown parsers and malformed bodies."""
from __future__ import annotations

import pytest

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.parametrize("parser", ["deepseek-r1", "qwen3"])
def test_separate_reasoning(server, parser):
    out = server.client.post("/separate_reasoning", json={
        "text": "<think>The user wants a city.</think>Paris.", "reasoning_parser": parser})
    assert out.status_code == 200
    assert out.json() == {"text": "Paris.", "reasoning_text": "The user wants a city."}


def test_parse_function_call(server):
    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    out = server.client.post("/parse_function_call", json={"text": text, "tool_call_parser": "hermes",
                                                            "tools": [WEATHER]})
    assert out.status_code == 200
    assert out.json() == {"normal_text": "Let me check.", "calls": [
        {"tool_index": 0, "name": "get_weather", "parameters": '{"city": "Paris"}'},
        {"tool_index": 1, "name": "get_weather", "parameters": '{"city": "Oslo"}'}]}
    llama = server.client.post("/parse_function_call", json={
        "text": '{"name": "get_weather", "parameters": {"city": "Rome"}}', "tool_call_parser": "llama3",
        "tools": [WEATHER]}).json()
    assert llama == {"normal_text": "", "calls": [
        {"tool_index": 0, "name": "get_weather", "parameters": '{"city": "Rome"}'}]}
    plain = server.client.post("/parse_function_call", json={"text": "No calls here.", "tool_call_parser": "hermes",
                                                              "tools": [WEATHER]}).json()
    assert plain == {"normal_text": "No calls here.", "calls": []}


@pytest.mark.parametrize("path, body, message", [
    ("/separate_reasoning", {"text": "x", "reasoning_parser": "nope"}, "reasoning_parser 'nope'"),
    ("/separate_reasoning", {"text": "x"}, "reasoning_parser"),
    ("/separate_reasoning", {"text": "x", "reasoning_parser": "qwen3", "return_blocks": True}, "return_blocks"),
    ("/parse_function_call", {"text": "x", "tool_call_parser": "nope", "tools": [WEATHER]}, "tool_call_parser 'nope'"),
    ("/parse_function_call", {"text": "x", "tool_call_parser": "hermes", "tools": [{"type": "function"}]}, "tools"),
    ("/parse_function_call", {"text": 5, "tool_call_parser": "hermes", "tools": []}, "text"),
])
def test_bad_bodies_are_400(server, path, body, message):
    out = server.client.post(path, json=body)
    assert out.status_code == 400
    assert message in out.text
