"""Formats where a call is an opening tag, the function's name, a separator, the arguments as a JSON object and a
closing tag, optionally inside a section of calls. They differ only in their tags, so each is data:

    deepseekv3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
                 ```json
                 {"city": "Paris"}
                 ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    deepseekv31  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
                 <｜tool▁calls▁end｜>
    kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
                 {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
    mistral      [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}            (tokenizer v11 and later)"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from radixlm.runtime.parsers.tool_calls.core import (
    Call, CallTags, Invalid, Segment, ToolCallFormat, ToolSet, ToolSpec, frame_tagged, held, json_args, tag,
)
from radixlm.runtime.parsers.tool_calls.json_scan import args_object, ws

_LONGEST_NAME = 256  # a name field longer than this is not a name


@dataclass(frozen=True)
class NamedArgs(ToolCallFormat):
    call_open: str
    name_end: str
    call_close: tuple[str, ...] = ()  # each after optional whitespace; a final call may lack them (a stop token)
    section_open: str = ""
    section_close: str = ""
    name_pattern: str = r"\s*([\w\-]+)\s*"  # the name field, group 1 the function's name
    # What a constraint writes: `write_open` (call_open when empty), then `write_name` with `{name}` replaced;
    # between calls `separator`.
    write_open: str = ""
    write_name: str = "{name}"
    write_close: str = ""
    separator: str = ""
    special_markers: bool = False

    def frame(self, text: str, final: bool, tools: ToolSet) -> list[Segment]:
        return frame_tagged(text, final, self.call_open, lambda k: self._call(text, k, final, tools), self.clean)

    def clean(self, content: str, complete: bool) -> str:
        """Content as the client sees it: section tags dropped; while streaming, a tag's partial opening held."""
        if not complete:
            content = content[:len(content) - held(content, *self._tags())]
        for t in (self.section_open, self.section_close):
            if t:
                content = content.replace(t, "")
        return content

    def _tags(self) -> tuple[str, ...]:
        return tuple(t for t in (self.call_open, self.section_open, self.section_close) if t)

    def _call(self, text: str, k: int, final: bool, tools: ToolSet) -> tuple[Call, int | None]:
        """The call opening at text[k] and where it ends (None while it may go on)."""
        start = k + len(self.call_open)
        e = text.find(self.name_end, start)
        if e < 0:
            field = text[start:]
            if final or len(field) > _LONGEST_NAME:
                raise Invalid
            return Call(None, "", False), None
        m = re.fullmatch(self.name_pattern, text[start:e], re.S)
        if m is None or m.group(1) not in tools:
            raise Invalid
        name = m.group(1)
        a = ws(text, e + len(self.name_end))
        args_end = args_object(text, a, final)
        if args_end is None:
            if self.call_close and self.call_close[-1] in text[a:]:
                raise Invalid  # the call closed while its arguments were still open
            return Call(name, text[a:], False), None
        p = args_end
        for close in self.call_close:
            q = ws(text, p)
            if text.startswith(close, q):
                p = q + len(close)
            elif final and q == len(text):
                return Call(name, text[a:args_end], True), len(text)
            elif not final and close.startswith(text[q:]):
                return Call(name, text[a:args_end], False), None
            else:
                raise Invalid
        return Call(name, text[a:args_end], True), p

    def call_tags(self, tools: Sequence[ToolSpec]) -> CallTags:
        opening = self.write_open or self.call_open
        tags = tuple(tag(opening + self.write_name.format(name=t.name), json_args(t.parameters),
                         self.write_close) for t in tools)
        return CallTags(tags, trigger=opening, separator=self.separator, prefix=self.section_open,
                        suffix=self.section_close)


DEEPSEEK_V3 = NamedArgs(
    call_open="<｜tool▁call▁begin｜>function<｜tool▁sep｜>", name_end="```json",
    call_close=("```", "<｜tool▁call▁end｜>"),
    section_open="<｜tool▁calls▁begin｜>", section_close="<｜tool▁calls▁end｜>",
    write_name="{name}\n```json\n", write_close="\n```<｜tool▁call▁end｜>", separator="\n")

DEEPSEEK_V31 = NamedArgs(
    call_open="<｜tool▁call▁begin｜>", name_end="<｜tool▁sep｜>", call_close=("<｜tool▁call▁end｜>",),
    section_open="<｜tool▁calls▁begin｜>", section_close="<｜tool▁calls▁end｜>",
    write_name="{name}<｜tool▁sep｜>", write_close="<｜tool▁call▁end｜>")

# The call id is `functions.NAME:INDEX`; the index is the call's place in the conversation, which the parser reads
# past and a constraint writes as 0.
KIMI_K2 = NamedArgs(
    call_open="<|tool_call_begin|>", name_end="<|tool_call_argument_begin|>", call_close=("<|tool_call_end|>",),
    section_open="<|tool_calls_section_begin|>", section_close="<|tool_calls_section_end|>",
    name_pattern=r"\s*(?:functions\.)?([\w\-]+)(?::\d+)?\s*",
    write_name="functions.{name}:0<|tool_call_argument_begin|>", write_close="<|tool_call_end|>",
    special_markers=True)

MISTRAL_NAMED = NamedArgs(call_open="[TOOL_CALLS]", name_end="[ARGS]", write_name="{name}[ARGS]",
                          special_markers=True)
