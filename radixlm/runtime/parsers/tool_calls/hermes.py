"""Hermes / Qwen2.5 / Qwen3: a JSON call object between tags, one tagged block per call.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from radixlm.runtime.parsers.tool_calls.core import (
    Call, CallTags, Invalid, Segment, ToolCallFormat, ToolSet, ToolSpec, held, json_args, tag,
)
from radixlm.runtime.parsers.tool_calls.json_scan import call_objects, read_call, ws


@dataclass(frozen=True)
class JsonInTags(ToolCallFormat):
    open: str = "<tool_call>"
    close: str = "</tool_call>"
    # Small Qwen models sometimes drop the tags and answer with the bare call object: an output that is nothing
    # but calls of the given tools counts as calls.
    bare_objects: bool = True

    def frame(self, text: str, final: bool, tools: ToolSet) -> list[Segment]:
        if self.bare_objects and text.lstrip().startswith("{"):
            try:
                calls, _ = call_objects(text, 0, final, tools, array=False)
                return ["", *calls]
            except Invalid:
                pass
        out: list[Segment] = []
        pos = 0
        while True:
            k = text.find(self.open, pos)
            if k < 0:
                tail = text[pos:]
                out.append(tail if final else tail[:len(tail) - held(tail, self.open)])
                return out
            out.append(text[pos:k])
            body_start = k + len(self.open)
            e = text.find(self.close, body_start)
            closed = e >= 0
            body = text[body_start:e if closed else len(text)]
            if not closed and not final:
                body = body[:len(body) - held(body, self.close)]
            try:
                out.append(self._body(body, closed, final, tools))
            except Invalid:
                out.append(text[k:e + len(self.close) if closed else len(text)])
            if not closed:
                return out
            pos = e + len(self.close)

    @staticmethod
    def _body(body: str, closed: bool, final: bool, tools: ToolSet) -> Call:
        i = ws(body, 0)
        if i == len(body):
            if closed or final:
                raise Invalid
            return Call(None, "", False)
        if body[i] != "{":
            raise Invalid
        call, end = read_call(body, i, closed or final, tools)
        if end is not None and body[end:].strip():
            raise Invalid
        call.done = closed or (final and call.done)
        return call

    def call_tags(self, tools: Sequence[ToolSpec]) -> CallTags:
        tags = tuple(tag(f'{self.open}\n{{"name": {json.dumps(t.name)}, "arguments": ', json_args(t.parameters),
                         f"}}\n{self.close}") for t in tools)
        return CallTags(tags, trigger=self.open, separator="\n")


HERMES = JsonInTags()
