"""Llama 3.1 JSON calls: `parameters`, an optional `<|python_tag|>`, several separated by ';'."""
from __future__ import annotations

import pytest

from radixlm.runtime.parsers.tool_calls import parse
from tests.runtime.parsers.tool_calls.helpers import assert_never_raises, assert_streams_add_up, calls

TWO = '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "X", "days": 2}}'


def test_documented_outputs():
    assert calls('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', "llama3") == [
        ("get_weather", {"city": "Oslo"})]
    assert calls(TWO, "llama3") == [("get_time", {}), ("get_weather", {"city": "X", "days": 2})]
    p = parse("llama3", 'Calling.<|python_tag|>{"name": "get_time", "parameters": {}}', {"get_time": None})
    assert p.content == "Calling." and len(p.calls) == 1


@pytest.mark.parametrize("text", [
    "The answer is 4.", '{"answer": 4}', '{"name": "get_time", "parameters": {}} and more'])
def test_text_and_json_that_is_not_a_call_stay_content(text):
    p = parse("llama3", text, {"get_time": None})
    assert p.calls == [] and p.content == text


@pytest.mark.parametrize("text", [
    TWO, "Plain answer, no call.", '<|python_tag|>{"name": "get_time", "parameters": {}}'])
def test_streamed_in_pieces_of_every_size(text):
    assert_streams_add_up("llama3", text)


def test_malformed_text_never_raises():
    assert_never_raises("llama3", TWO)
