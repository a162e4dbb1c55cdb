"""Mistral: `[TOOL_CALLS]` with a JSON array (v0.3), or name `[ARGS]` arguments per call (tokenizer v11+)."""
from __future__ import annotations

import pytest

from radixlm.runtime.parsers.tool_calls import parse
from tests.runtime.parsers.tool_calls.helpers import assert_never_raises, assert_streams_add_up, calls

ARRAY = ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
         '{"name": "get_time", "arguments": {}}]')
NAMED = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]get_time[ARGS]{}'
WANT = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]


@pytest.mark.parametrize("text", [ARRAY, NAMED, ARRAY[len("[TOOL_CALLS] "):]])
def test_documented_outputs(text):
    assert calls(text, "mistral") == WANT


def test_text_around_calls():
    tools = {"get_weather": None, "get_time": None}
    p = parse("mistral", "Checking. " + NAMED, tools)
    assert p.content == "Checking." and len(p.calls) == 2
    assert parse("mistral", "[1, 2] are numbers", tools).content == "[1, 2] are numbers"
    bad = '[TOOL_CALLS] [{"name": "nope", "arguments": {}}]'
    assert parse("mistral", bad, tools).content == bad


@pytest.mark.parametrize("text", [ARRAY, NAMED, "Plain [text] answer."])
def test_streamed_in_pieces_of_every_size(text):
    assert_streams_add_up("mistral", text)


@pytest.mark.parametrize("text", [ARRAY, NAMED])
def test_malformed_text_never_raises(text):
    assert_never_raises("mistral", text)
