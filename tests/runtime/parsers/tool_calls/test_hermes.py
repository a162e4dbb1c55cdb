"""Hermes / Qwen2.5 `<tool_call>` JSON blocks."""
from __future__ import annotations

import pytest

from radixlm.runtime.parsers.tool_calls import parse
from tests.runtime.parsers.tool_calls.helpers import assert_never_raises, assert_streams_add_up, calls

TWO = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "São Paulo", "days": 3}}\n'
       '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


@pytest.mark.parametrize("fmt", ["hermes", "qwen25", "qwen"])
def test_several_calls_with_text_before(fmt):
    p = parse(fmt, TWO, {"get_weather": None, "get_time": None})
    assert p.content == "Let me check."
    assert calls(TWO, fmt) == [("get_weather", {"city": "São Paulo", "days": 3}), ("get_time", {})]
    assert p.calls[0].arguments == '{"city": "São Paulo", "days": 3}'  # the model's own text, not re-serialised


def test_no_calls_text_after_and_bare_object():
    assert parse("hermes", "  Hello there. ", {"f": None}).content == "Hello there."
    assert parse("hermes", "", {"f": None}).content is None
    p = parse("hermes", '<tool_call>{"name": "get_time"}</tool_call> done', {"get_time": None})
    assert [c.name for c in p.calls] == ["get_time"] and p.content == "done"
    # small models sometimes drop the tags: an output of nothing but calls counts
    assert calls(' {"name": "get_weather", "arguments": {"city": "Paris"}}\n', "hermes") == [
        ("get_weather", {"city": "Paris"})]
    for text in ('{"name": "other", "arguments": {}}', '{"answer": 4}', '{"name": "get_time"} trailing'):
        assert parse("hermes", text, {"get_time": None}).content == text


def test_unclosed_call_at_the_end_is_a_call():
    assert calls('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}', "hermes") == [
        ("get_weather", {"city": "Rome"})]


@pytest.mark.parametrize("body", [
    '{"name": "get_weather", "arguments": {"city": }}',  # bad JSON
    '{"name": "get_weather", "arguments": {"city": "Paris"}',  # object never closed
    '{"name": "nope", "arguments": {}}',  # not one of the tools
    '{"name": "get_weather", "arguments": "Paris"}',  # arguments not an object
    '{"fn": "get_weather"}',  # not a call
    'get_weather(city="Paris")',
])
def test_malformed_call_is_left_as_content(body):
    text = f"Hi <tool_call>\n{body}\n</tool_call>"
    p = parse("hermes", text, {"get_weather": None})
    assert p.calls == [] and p.content == text.strip()


def test_malformed_call_does_not_hide_a_good_one():
    text = '<tool_call>{"name": "x"}</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    p = parse("hermes", text, {"get_time": None})
    assert [c.name for c in p.calls] == ["get_time"] and p.content == '<tool_call>{"name": "x"}</tool_call>'


@pytest.mark.parametrize("text", [
    TWO,
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{"name": "get_weather", "argument": 1} is not a call',
    "No tools needed: 2 < 3 and <b>bold</b> text.",
    '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call> and after',
])
def test_streamed_in_pieces_of_every_size(text):
    assert_streams_add_up("hermes", text)


def test_malformed_text_never_raises():
    assert_never_raises("hermes", TWO)
