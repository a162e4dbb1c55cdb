"""Mistral: `[TOOL_CALLS]` then a JSON array of call objects (Mistral-7B-v0.3, Nemo), or, from tokenizer v11 on,
`[TOOL_CALLS]name[ARGS]{...}` once per call.

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

`[TOOL_CALLS]` is a control token: detokenized without special tokens, the array stands alone at the start of
the output, and is read as calls too."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from radixlm.runtime.parsers.tool_calls.core import (
    CallTags, Invalid, Segment, ToolCallFormat, ToolSet, ToolSpec, held, json_args, tag,
)
from radixlm.runtime.parsers.tool_calls.json_scan import call_objects, ws
from radixlm.runtime.parsers.tool_calls.named_args import MISTRAL_NAMED

TOOL_CALLS = "[TOOL_CALLS]"


@dataclass(frozen=True)
class Mistral(ToolCallFormat):
    special_markers = True

    def frame(self, text: str, final: bool, tools: ToolSet) -> list[Segment]:
        k = text.find(TOOL_CALLS)
        if k < 0:
            if not final and TOOL_CALLS.startswith(text.lstrip()):
                return [""]
            if text.lstrip().startswith("[") and (segments := self._array(text, 0, "", final, tools)) is not None:
                return segments
            return [text if final else text[:len(text) - held(text, TOOL_CALLS)]]
        i = ws(text, k + len(TOOL_CALLS))
        if i == len(text) and not final:
            return [text[:k]]
        if i < len(text) and text[i] == "[" and not text.startswith(TOOL_CALLS, i):
            return self._array(text, i, text[:k], final, tools) or [text]
        return MISTRAL_NAMED.frame(text, final, tools)

    @staticmethod
    def _array(text: str, i: int, before: str, final: bool, tools: ToolSet) -> list[Segment] | None:
        """The calls of the array opening at text[i]; None when it is not an array of calls."""
        try:
            calls, end = call_objects(text, i, final, tools, array=True, separators=",")
        except Invalid:
            return None
        if end is None:
            return [before, *calls]
        for c in calls:
            c.done = True
        after = text[end:]
        return [before, *calls, after]

    def call_tags(self, tools: Sequence[ToolSpec]) -> CallTags:
        tags = tuple(tag(f'{{"name": {json.dumps(t.name)}, "arguments": ', json_args(t.parameters), "}")
                     for t in tools)
        return CallTags(tags, trigger='{"name": ', separator=", ", prefix=TOOL_CALLS + "[", suffix="]")


MISTRAL = Mistral()
