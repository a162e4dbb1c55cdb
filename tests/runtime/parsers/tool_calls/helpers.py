"""Checks every format's tests share: streamed deltas add up to the parse, and no text makes a parser raise."""
from __future__ import annotations

import json

from radixlm.runtime.parsers.tool_calls import ToolCallStreamer, frame, parse

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                            "metric": {"type": "boolean"}}, "required": ["city"]}
TOOLS = {"get_weather": WEATHER, "get_time": None}


def calls(text: str, fmt: str, tools=TOOLS) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parse(fmt, text, tools).calls]


def streamed(fmt: str, text: str, size: int, tools=TOOLS) -> tuple[str, list[dict]]:
    """Feeds growing prefixes `size` characters apart; returns the content sent and the calls the deltas make."""
    s = ToolCallStreamer(fmt, tools)
    content, assembled = "", []
    prefixes = [text[:n] for n in range(size, len(text), size)] + [text]
    for n, prefix in enumerate(prefixes):
        d = s.feed(prefix, final=n == len(prefixes) - 1)
        content += d.content
        for c in d.calls:
            if "type" in c:
                assert c["index"] == len(assembled) and c["function"]["arguments"] == ""
                assembled.append({"name": c["function"]["name"], "arguments": ""})
            else:
                assert "name" not in c["function"]
                assembled[c["index"]]["arguments"] += c["function"]["arguments"]
    return content, assembled


def assert_streams_add_up(fmt: str, text: str, tools=TOOLS) -> None:
    """For pieces of every size, the streamed content and calls equal the parse of the whole text."""
    p = parse(fmt, text, tools)
    want = [{"name": c.name, "arguments": c.arguments} for c in p.calls]
    for size in range(1, len(text) + 1):
        content, assembled = streamed(fmt, text, size, tools)
        assert (content, assembled) == (p.content or "", want), f"pieces of {size}"


def assert_never_raises(fmt: str, text: str, tools=TOOLS) -> None:
    """Every prefix, and the text with any one character dropped, frames without raising."""
    for i in range(len(text) + 1):
        for t in (text[:i], text[:i] + text[i + 1:]):
            frame(fmt, t, True, tools)
            frame(fmt, t, False, tools)
