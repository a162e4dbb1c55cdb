"""The JSON array of calls that tool_choice=required or a named function is constrained to when the family's own
format cannot be written as xgrammar structural tags.

    [{"name": "get_weather", "arguments": {"city": "Paris"}}]"""
from __future__ import annotations

import json
from dataclasses import dataclass

from radixlm.runtime.parsers.tool_calls.core import Invalid, Segment, ToolCallFormat, ToolSet, ToolSpec
from radixlm.runtime.parsers.tool_calls.json_scan import call_objects, ws


@dataclass(frozen=True)
class JsonArray(ToolCallFormat):
    def frame(self, text: str, final: bool, tools: ToolSet) -> list[Segment]:
        try:
            calls, end = call_objects(text, 0, final, tools, array=True, separators=",")
            if end is not None and ws(text, end) != len(text):
                raise Invalid
            return list(calls)
        except Invalid:
            return [text]

    @staticmethod
    def schema(tools: list[ToolSpec], single: bool, arg_key: str = "arguments") -> str:
        """The JSON schema of the array: each item one tool's name with arguments valid for its parameters under
        `arg_key` (the key the model family was trained on)."""
        items = [{
            "type": "object",
            "properties": {"name": {"const": t.name}, arg_key: t.parameters if t.parameters else {"type": "object"}},
            "required": ["name", arg_key],
            "additionalProperties": False,
        } for t in tools]
        schema: dict = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}, "minItems": 1}
        if single:
            schema["maxItems"] = 1
        return json.dumps(schema)


JSON_ARRAY = JsonArray()
