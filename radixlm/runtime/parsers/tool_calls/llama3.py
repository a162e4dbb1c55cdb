"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: a call object with `parameters`, after `<|python_tag|>` or alone; several
calls separated by ';'.

    {"name": "get_weather", "parameters": {"city": "Paris"}}"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from radixlm.runtime.parsers.tool_calls.core import (
    CallTags, Invalid, Segment, ToolCallFormat, ToolSet, ToolSpec, held, json_args, tag,
)
from radixlm.runtime.parsers.tool_calls.json_scan import call_objects

PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class Llama3Json(ToolCallFormat):
    def frame(self, text: str, final: bool, tools: ToolSet) -> list[Segment]:
        k = text.find(PYTHON_TAG)
        if k >= 0:
            prefix, start = text[:k], k + len(PYTHON_TAG)
        else:
            stripped = text.lstrip()
            if not final and (not stripped or PYTHON_TAG.startswith(stripped)):
                return [""]
            if not stripped.startswith("{"):
                return [text if final else text[:len(text) - held(text, PYTHON_TAG)]]
            prefix, start = "", 0
        try:
            calls, _ = call_objects(text, start, final, tools, array=False)
            return [prefix, *calls]
        except Invalid:
            return [text]

    def call_tags(self, tools: Sequence[ToolSpec]) -> CallTags:
        tags = tuple(tag(f'{{"name": {json.dumps(t.name)}, "parameters": ', json_args(t.parameters), "}")
                     for t in tools)
        return CallTags(tags, trigger='{"name": ', separator="; ")


LLAMA3 = Llama3Json()
