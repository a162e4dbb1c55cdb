"""DeepSeek-V3, DeepSeek-V3.1 and Kimi-K2: name, separator, JSON arguments, each call tagged, in a section."""
from __future__ import annotations

import pytest

from radixlm.runtime.parsers.tool_calls import parse
from tests.runtime.parsers.tool_calls.helpers import assert_never_raises, assert_streams_add_up, calls

WANT = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]
DOCUMENTED = {
    "deepseekv3": (
        "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n'
        "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "deepseekv31": (
        'Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}'
        "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "kimi_k2": (
        "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|><|tool_call_begin|>'
        "functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"),
}


@pytest.mark.parametrize("fmt", DOCUMENTED)
def test_documented_output(fmt):
    text = DOCUMENTED[fmt]
    assert calls(text, fmt) == WANT
    assert parse(fmt, text, {"get_weather": None, "get_time": None}).content == "Let me look."
    assert parse(fmt, text + " Done.", {"get_weather": None, "get_time": None}).content == "Let me look. Done."


@pytest.mark.parametrize("fmt", DOCUMENTED)
def test_streamed_in_pieces_of_every_size(fmt):
    assert_streams_add_up(fmt, DOCUMENTED[fmt])


@pytest.mark.parametrize("fmt", DOCUMENTED)
def test_malformed_text_never_raises(fmt):
    assert_never_raises(fmt, DOCUMENTED[fmt])


def test_malformed_calls_stay_content_without_hiding_good_ones():
    bad = '<｜tool▁call▁begin｜>nope<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜>'
    good = '<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>'
    p = parse("deepseekv31", bad + good, {"get_time": None})
    assert p.content == bad and [c.name for c in p.calls] == ["get_time"]
    for args in ('{"a": }', '"text"', '{"a": 1'):
        text = f"<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{args}"
        assert parse("deepseekv31", text, {"get_time": None}).content == text
    # a final call missing its closing tag (a stop token) still counts
    assert calls('<|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}', "kimi_k2") == [
        ("get_time", {})]
