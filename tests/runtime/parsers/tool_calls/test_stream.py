"""The streaming state machine: held-back tags, when a call is announced, the cap on calls."""
from __future__ import annotations

from radixlm.runtime.parsers.tool_calls import ToolCallStreamer, parse

TOOLS = {"get_time": None, "get_weather": None}


def test_a_partial_tag_is_held_back_then_released():
    s = ToolCallStreamer("hermes", TOOLS)
    assert s.feed("Hi <tool", False).content == "Hi"
    d = s.feed("Hi <tooly>", False)
    assert d.content == " <tooly>" and d.calls == []
    # a call is announced when its arguments begin, or when it is complete without any
    assert s.feed('Hi <tooly><tool_call>{"name": "get_time"', False).calls == []
    d = s.feed('Hi <tooly><tool_call>{"name": "get_time"}</tool_call>', True)
    assert d.content == "" and d.calls == [
        {"index": 0, "type": "function", "function": {"name": "get_time", "arguments": ""}},
        {"index": 0, "function": {"arguments": "{}"}}]
    assert s.called


def test_max_calls_keeps_the_first():
    text = ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
    assert [c.name for c in parse("hermes", text, TOOLS, max_calls=1).calls] == ["get_time"]
    d = ToolCallStreamer("hermes", TOOLS, max_calls=1).feed(text, True)
    assert {c["index"] for c in d.calls} == {0}


def test_bare_names_are_tools_without_schemas():
    assert parse("glm45", "<tool_call>get_time\n<arg_key>n</arg_key><arg_value>3</arg_value></tool_call>",
                 ["get_time"]).calls[0].arguments == '{"n": 3}'
