"""The JSON array a constraint falls back to, and its schema."""
from __future__ import annotations

import json

from radixlm.runtime.parsers.tool_calls import ToolSpec, parse
from radixlm.runtime.parsers.tool_calls.json_array import JsonArray
from tests.runtime.parsers.tool_calls.helpers import WEATHER, assert_never_raises, assert_streams_add_up, calls

TWO = '[{"name": "get_weather", "arguments": {"city": "Lima"}}, {"name": "get_time", "parameters": {}}]'


def test_calls_and_a_cut_off_array():
    assert calls(TWO, "json_array") == [("get_weather", {"city": "Lima"}), ("get_time", {})]
    cut = '[{"name": "get_weather", "arguments": {"ci'  # cut off by max_tokens
    p = parse("json_array", cut, {"get_weather": None})
    assert p.calls == [] and p.content == cut
    assert parse("json_array", TWO + " more", {"get_weather": None, "get_time": None}).calls == []


def test_streamed_and_robust():
    assert_streams_add_up("json_array", TWO)
    assert_never_raises("json_array", TWO)


def test_schema():
    tools = [ToolSpec("get_weather", WEATHER), ToolSpec("get_time", None)]
    one = json.loads(JsonArray.schema(tools[:1], single=True, arg_key="parameters"))
    assert one["maxItems"] == 1 and one["items"]["properties"]["name"] == {"const": "get_weather"}
    assert one["items"]["required"] == ["name", "parameters"] and one["items"]["properties"]["parameters"] == WEATHER
    both = json.loads(JsonArray.schema(tools, single=False))
    assert "maxItems" not in both and both["items"]["anyOf"][1]["properties"]["arguments"] == {"type": "object"}
