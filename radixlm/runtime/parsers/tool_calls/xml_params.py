"""Formats that write each argument as its own XML-like element with the value as bare text: Qwen3-Coder and
GLM-4.5 / 4.6 / 4.7. They differ only in their tags, so each is data:

    qwen3_coder  <tool_call>
                 <function=get_weather>
                 <parameter=city>
                 Paris
                 </parameter>
                 </function>
                 </tool_call>
    glm45        <tool_call>get_weather
                 <arg_key>city</arg_key>
                 <arg_value>Paris</arg_value>
                 </tool_call>
    glm47        <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>
    deepseekv32  <｜DSML｜function_calls>
                 <｜DSML｜invoke name="get_weather">
                 <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
                 <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
                 </｜DSML｜invoke>
                 </｜DSML｜function_calls>

A value is text; it becomes JSON by the parameter's schema (a string stays as written, anything else is read as
JSON, else kept as a string), or where the format says so (DeepSeek's `string="true"`) by that. The arguments
stream one completed parameter at a time."""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.parsers.tool_calls.core import (
    Call, CallTags, Invalid, Segment, ToolCallFormat, ToolSet, ToolSpec, frame_tagged, held, json_args, tag,
)
from radixlm.runtime.parsers.tool_calls.json_scan import ws

_NAME = re.compile(r"[\w\-.]*")


class _Pending(Exception):
    """The text stops inside the call."""


def typed_value(raw: str, schema: dict | None) -> Any:
    """The JSON value of a parameter written as text, by its schema."""
    types = (schema or {}).get("type")
    types = types if isinstance(types, list) else [types]
    if "string" in types or (schema is not None and types == [None] and "enum" not in schema):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(raw)  # Python literals (True, None, 'a') that some models write
        json.dumps(value)
        return value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


@dataclass(frozen=True)
class XmlParams(ToolCallFormat):
    name_open: str  # before the name, after the call's opening tag
    name_close: str
    key_open: str
    key_close: str
    value_open: str
    value_close: str
    function_close: str  # after the last parameter, before the call's closing tag
    style: str  # xgrammar's JSONSchemaFormat style of the arguments
    write_name: str  # what a constraint writes after call_open (`{name}` replaced)
    write_close: str
    separator: str = "\n"
    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"
    # After the key, one of these marks, saying whether the value is a bare string (else JSON); none: the schema
    value_kinds: tuple[tuple[str, bool], ...] = ()
    section_open: str = ""  # around the calls
    section_close: str = ""

    def frame(self, text: str, final: bool, tools: ToolSet) -> list[Segment]:
        return frame_tagged(text, final, self.call_open, lambda k: self._call(text, k, final, tools), self._clean)

    def _clean(self, content: str, complete: bool) -> str:
        tags = tuple(t for t in (self.call_open, self.section_open, self.section_close) if t)
        if not complete:
            content = content[:len(content) - held(content, *tags)]
        for t in tags[1:]:
            content = content.replace(t, "")
        return content

    def _expect(self, text: str, i: int, literal: str) -> int:
        """Index after `literal` at text[i]; _Pending if the text stops inside it, Invalid if it is not there."""
        if text.startswith(literal, i):
            return i + len(literal)
        if literal.startswith(text[i:]):
            raise _Pending
        raise Invalid

    def _call(self, text: str, k: int, final: bool, tools: ToolSet) -> tuple[Call, int | None]:
        params: list[str] = []
        name: str | None = None
        i = k
        try:
            i = self._expect(text, ws(text, k + len(self.call_open)), self.name_open)
            j = _NAME.match(text, i).end()
            if j == len(text):
                raise _Pending
            name = text[i:j]
            if name not in tools:
                raise Invalid
            i = self._expect(text, j, self.name_close)
            properties = ((tools[name] or {}).get("properties") or {}) if tools[name] is not None else None
            while True:
                i = ws(text, i)
                if text.startswith(self.key_open, i):
                    key, value, is_string, i = self._param(text, i)
                    schema = properties.get(key) if properties is not None else None
                    if (properties is not None and schema is None) or is_string:
                        schema = {"type": "string"}  # a parameter the schema does not name stays text
                    elif is_string is False:
                        schema = None
                    params.append(f"{json.dumps(key, ensure_ascii=False)}: "
                                  f"{json.dumps(typed_value(value, schema), ensure_ascii=False)}")
                    continue
                if self.function_close and text.startswith(self.function_close, i):
                    i = self._expect(text, ws(text, i + len(self.function_close)), self.call_close)
                elif text.startswith(self.call_close, i):
                    i += len(self.call_close)
                elif i == len(text) or any(t.startswith(text[i:]) for t in
                                           (self.key_open, self.function_close or self.call_close, self.call_close)):
                    raise _Pending
                else:
                    raise Invalid
                return Call(name, "{" + ", ".join(params) + "}", True), i
        except _Pending:
            if final:
                if name is not None and ws(text, i) == len(text) and i > k:
                    return Call(name, "{" + ", ".join(params) + "}", True), len(text)  # closing tags cut
                raise Invalid from None
            return Call(name, "{" + ", ".join(params) if name is not None else "", False), None

    def _param(self, text: str, i: int) -> tuple[str, str, bool | None, int]:
        i += len(self.key_open)
        e = text.find(self.key_close, i)
        if e < 0:
            raise _Pending
        key = text[i:e].strip()
        i = e + len(self.key_close)
        is_string = None
        if self.value_kinds:
            kind = next(((mark, s) for mark, s in self.value_kinds if text.startswith(mark, i)), None)
            if kind is None:
                raise _Pending if any(mark.startswith(text[i:]) for mark, _ in self.value_kinds) else Invalid
            i, is_string = i + len(kind[0]), kind[1]
        if self.value_open:
            i = self._expect(text, ws(text, i), self.value_open)
        e = text.find(self.value_close, i)
        if e < 0:
            raise _Pending
        value = text[i:e]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        return key, value, is_string, e + len(self.value_close)

    def call_tags(self, tools: Sequence[ToolSpec]) -> CallTags:
        tags = tuple(tag(self.call_open + self.write_name.format(name=t.name), json_args(t.parameters, self.style),
                         self.write_close) for t in tools)
        return CallTags(tags, trigger=self.call_open, separator=self.separator, prefix=self.section_open,
                        suffix=self.section_close)


QWEN3_CODER = XmlParams(
    name_open="<function=", name_close=">", key_open="<parameter=", key_close=">", value_open="",
    value_close="</parameter>", function_close="</function>", style="qwen_xml",
    write_name="\n<function={name}>\n", write_close="\n</function>\n</tool_call>")

GLM45 = XmlParams(
    name_open="", name_close="", key_open="<arg_key>", key_close="</arg_key>", value_open="<arg_value>",
    value_close="</arg_value>", function_close="", style="glm_xml",
    write_name="{name}\n", write_close="</tool_call>")

GLM47 = XmlParams(
    name_open="", name_close="", key_open="<arg_key>", key_close="</arg_key>", value_open="<arg_value>",
    value_close="</arg_value>", function_close="", style="glm_xml",
    write_name="{name}", write_close="</tool_call>", separator="")

_DSML = "｜DSML｜"
DEEPSEEK_V32 = XmlParams(
    call_open=f'<{_DSML}invoke name="', name_open="", name_close='">', key_open=f'<{_DSML}parameter name="',
    key_close='"', value_kinds=((' string="true">', True), (' string="false">', False)), value_open="",
    value_close=f"</{_DSML}parameter>", function_close="", call_close=f"</{_DSML}invoke>",
    section_open=f"<{_DSML}function_calls>", section_close=f"</{_DSML}function_calls>", style="deepseek_xml",
    write_name='{name}">\n', write_close=f"</{_DSML}invoke>\n", separator="")
