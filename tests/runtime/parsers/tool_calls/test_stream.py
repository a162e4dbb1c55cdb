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


def test_a_call_that_goes_wrong_after_it_began_gets_no_further_deltas():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<oops>\n</function>\n"
            "</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>")
    s = ToolCallStreamer("qwen3_coder", TOOLS)
    sent = [d for n in range(1, len(text) + 1) for d in s.feed(text[:n], n == len(text)).calls]
    # get_weather was announced; the parse drops it, and get_time's arguments must not be added to it
    assert [c.name for c in parse("qwen3_coder", text, TOOLS).calls] == ["get_time"]
    assert s.diverged and {c["index"] for c in sent} == {0}
    assert "".join(c["function"]["arguments"] for c in sent) == '{"city": "Paris"'


def test_max_calls_keeps_the_first():
    text = ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
    assert [c.name for c in parse("hermes", text, TOOLS, max_calls=1).calls] == ["get_time"]
    d = ToolCallStreamer("hermes", TOOLS, max_calls=1).feed(text, True)
    assert {c["index"] for c in d.calls} == {0}


def test_bare_names_are_tools_without_schemas():
    assert parse("glm45", "<tool_call>get_time\n<arg_key>n</arg_key><arg_value>3</arg_value></tool_call>",
                 ["get_time"]).calls[0].arguments == '{"n": 3}'
