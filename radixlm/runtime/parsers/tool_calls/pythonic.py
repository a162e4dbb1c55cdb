"""Pythonic tool calls (Llama 3.2 / 3.3 / 4 with a pythonic template): a Python list of calls with keyword
arguments whose values are literals, as the whole output; Llama 4 may wrap it in `<|python_start|>` /
`<|python_end|>`.

    [get_weather(city="Paris", days=3), get_time(timezone="UTC")]

A call's arguments are complete only when its closing parenthesis comes, so each call streams whole. xgrammar
cannot hold Python literals to a JSON schema, so a constraint falls back to the JSON array of calls."""
from __future__ import annotations

import ast
import json
import warnings
from dataclasses import dataclass

from radixlm.runtime.parsers.tool_calls.core import Call, Invalid, Segment, ToolCallFormat, ToolSet
from radixlm.runtime.parsers.tool_calls.json_scan import ws

START, END = "<|python_start|>", "<|python_end|>"


def _element_end(text: str, i: int) -> int | None:
    """End of the list element starting at text[i]: the next top-level ',' or ']' (None while open)."""
    depth, quote = 0, None
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = None
        elif c in "'\"":
            quote = c * 3 if text.startswith(c * 3, i) else c
            i += len(quote) - 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i if c == "]" else None
            depth -= 1
        elif c == "," and depth == 0:
            return i
        i += 1
    return None


def _call(source: str, tools: ToolSet) -> Call:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in the model's strings
            node = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise Invalid from None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
            and node.func.id in tools and all(k.arg is not None for k in node.keywords)):
        raise Invalid
    try:
        args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        return Call(node.func.id, json.dumps(args, ensure_ascii=False), True)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Invalid from None


@dataclass(frozen=True)
class Pythonic(ToolCallFormat):
    def frame(self, text: str, final: bool, tools: ToolSet) -> list[Segment]:
        stripped = text.lstrip()
        if not final and (not stripped or START.startswith(stripped)):
            return [""]
        i = ws(text, len(text) - len(stripped))
        wrapped = text.startswith(START, i)
        if wrapped:
            i = ws(text, i + len(START))
        if i < len(text) and text[i] != "[" or i == len(text) and final:
            return [text]
        try:
            return ["", *self._calls(text, i, final, wrapped, tools)]
        except Invalid:
            return [text]

    @staticmethod
    def _calls(text: str, i: int, final: bool, wrapped: bool, tools: ToolSet) -> list[Call]:
        calls: list[Call] = []
        i = ws(text, i + 1)
        while True:
            if i < len(text) and text[i] == "]" and not calls:
                raise Invalid  # an empty list calls nothing
            end = _element_end(text, i)
            if end is None:
                if final:
                    raise Invalid
                return calls
            calls.append(_call(text[i:end], tools))
            if text[end] == "]":
                rest = text[end + 1:].strip()
                if wrapped and rest.startswith(END):
                    rest = rest[len(END):].strip()
                if rest and not (wrapped and not final and END.startswith(rest)):
                    raise Invalid
                return calls
            i = ws(text, end + 1)


PYTHONIC = Pythonic()
