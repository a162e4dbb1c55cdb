"""Pythonic calls: a Python list of calls with literal keyword arguments."""
from __future__ import annotations

import pytest

from radixlm.runtime.parsers.tool_calls import parse
from tests.runtime.parsers.tool_calls.helpers import assert_never_raises, assert_streams_add_up, calls

TWO = '[get_weather(city="Paris, \\"FR\\"", days=3, metric=True), get_time()]'
WANT = [("get_weather", {"city": 'Paris, "FR"', "days": 3, "metric": True}), ("get_time", {})]


@pytest.mark.parametrize("text", [TWO, f"<|python_start|>{TWO}<|python_end|>", f"  {TWO}\n"])
def test_documented_outputs(text):
    assert calls(text, "pythonic") == WANT


@pytest.mark.parametrize("text", [
    "[1, 2, 3]", "[]", "[get_time(1)]", "[nope()]", "[get_time(x=open('f'))]", f"{TWO} and more",
    "[get_weather(city='Paris'", "Use [get_time()] later",
])
def test_anything_else_is_content(text):
    p = parse("pythonic", text, {"get_weather": None, "get_time": None})
    assert p.calls == [] and p.content == text.strip()


@pytest.mark.parametrize("text", [TWO, f"<|python_start|>{TWO}<|python_end|>", "A plain (text) answer."])
def test_streamed_in_pieces_of_every_size(text):
    assert_streams_add_up("pythonic", text)


def test_malformed_text_never_raises():
    assert_never_raises("pythonic", TWO)
