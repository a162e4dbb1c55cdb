"""Qwen3-Coder, GLM-4.5 / 4.7 and DeepSeek-V3.2: one XML-like element per argument, values typed by the schema
(or by DeepSeek's string="true|false")."""
from __future__ import annotations

import pytest

from radixlm.runtime.parsers.tool_calls import parse
from radixlm.runtime.parsers.tool_calls.xml_params import typed_value
from tests.runtime.parsers.tool_calls.helpers import assert_never_raises, assert_streams_add_up, calls

WANT = [("get_weather", {"city": "Paris", "days": 3, "metric": True}), ("get_time", {})]
DOCUMENTED = {
    "qwen3_coder": (
        "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
    "glm45": (
        "I will check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n"
        "</tool_call>\n<tool_call>get_time\n</tool_call>"),
    "glm47": (
        "I will check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days"
        "</arg_key><arg_value>3</arg_value><arg_key>metric</arg_key><arg_value>true</arg_value></tool_call>"
        "<tool_call>get_time</tool_call>"),
    "deepseekv32": (
        'I will check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
        'string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="metric" string="false">true</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        '<｜DSML｜invoke name="get_time">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>'),
}


@pytest.mark.parametrize("fmt", DOCUMENTED)
def test_documented_output(fmt):
    assert calls(DOCUMENTED[fmt], fmt) == WANT
    p = parse(fmt, DOCUMENTED[fmt] + "\nDone.", {"get_weather": None, "get_time": None})
    assert " ".join(p.content.split()) == "I will check. Done."


def test_deepseek_says_which_values_are_strings():
    text = ('<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="false">7</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="days" string="true">3</｜DSML｜parameter>\n</｜DSML｜invoke>')
    assert calls(text, "deepseekv32") == [("get_weather", {"city": 7, "days": "3"})]
    bad = text.replace('string="true"', 'string="maybe"')
    assert parse("deepseekv32", bad, {"get_weather": None}).content == bad


def test_values_follow_the_schema():
    assert typed_value("3", {"type": "string"}) == "3"
    assert typed_value("3", {"type": "integer"}) == 3
    assert typed_value("[1, 2]", {"type": "array"}) == [1, 2]
    assert typed_value("True", {"type": "boolean"}) is True  # a Python literal
    assert typed_value("not json", {"type": "object"}) == "not json"
    assert typed_value("{'a': 1}", None) == {"a": 1}
    # an argument the schema does not name stays text; a tool without a schema reads JSON
    text = "<tool_call>get_weather<arg_key>zip</arg_key><arg_value>75001</arg_value></tool_call>"
    assert calls(text, "glm45") == [("get_weather", {"zip": "75001"})]
    assert calls(text, "glm45", {"get_weather": None}) == [("get_weather", {"zip": 75001})]


@pytest.mark.parametrize("text", [
    "<tool_call>\n<function=nope>\n</function>\n</tool_call>",  # not one of the tools
    "<tool_call>\n<function=get_time>\n<oops>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis",  # cut inside a value
])
def test_malformed_calls_stay_content(text):
    p = parse("qwen3_coder", text, {"get_weather": None, "get_time": None})
    assert p.calls == [] and p.content == text


@pytest.mark.parametrize("fmt", DOCUMENTED)
def test_streamed_in_pieces_of_every_size(fmt):
    assert_streams_add_up(fmt, DOCUMENTED[fmt])


@pytest.mark.parametrize("fmt", DOCUMENTED)
def test_malformed_text_never_raises(fmt):
    assert_never_raises(fmt, DOCUMENTED[fmt])
