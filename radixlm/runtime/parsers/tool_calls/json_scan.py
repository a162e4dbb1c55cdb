"""Scanning JSON that may still be growing: where a value ends (None while the text stops inside it), the members
of a call object, and arguments objects. A call's arguments are the model's own JSON text (not re-serialised),
which is what makes a prefix of them streamable; json.loads checks each once it is complete."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from radixlm.runtime.parsers.tool_calls.core import Call, Invalid, ToolSet

ARG_KEYS = ("arguments", "parameters")


def ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """End (exclusive) of the JSON string opening at text[i] == '"', None if it is not closed yet."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """End of the JSON value starting at text[i]; None if the text stops inside it. Brackets are matched, not
    validated: json.loads checks the complete value."""
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    j = i
    while j < len(text) and text[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(text) else None  # a number or literal may still go on


def loads(text: str):
    """json.loads, with Invalid for text that is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise Invalid from None


def args_object(text: str, i: int, complete: bool) -> int | None:
    """End of the arguments object opening at text[i] (None while open); Invalid unless it is a JSON object, or
    while `complete` (no more text will come) it is still open."""
    if i >= len(text):
        if complete:
            raise Invalid
        return None
    if text[i] != "{":
        raise Invalid
    end = value_end(text, i)
    if end is None:
        if complete:
            raise Invalid
        return None
    if not isinstance(loads(text[i:end]), dict):
        raise Invalid
    return end


@dataclass
class _ObjectScan:
    end: int | None  # end of the object, None while open
    members: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # key -> value span


def _scan_object(text: str, i: int, keys: tuple[str, ...]) -> _ObjectScan:
    """Top-level members of the object opening at text[i] == '{' (keys other than `keys` are invalid)."""
    scan = _ObjectScan(None)
    i = ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        scan.end = i + 1
        return scan
    while i < len(text):
        if text[i] != '"':
            raise Invalid
        key_end = string_end(text, i)
        if key_end is None:
            if not any(k.startswith(text[i + 1:]) for k in keys):
                raise Invalid
            return scan
        key = loads(text[i:key_end])
        if key not in keys:
            raise Invalid
        i = ws(text, key_end)
        if i == len(text):
            return scan
        if text[i] != ":":
            raise Invalid
        i = ws(text, i + 1)
        if i == len(text):
            return scan
        end = value_end(text, i)
        scan.members[key] = (i, end)
        if end is None:
            return scan
        i = ws(text, end)
        if i == len(text):
            return scan
        if text[i] == "}":
            scan.end = i + 1
            return scan
        if text[i] != ",":
            raise Invalid
        i = ws(text, i + 1)
    return scan


def read_call(text: str, i: int, complete: bool, tools: ToolSet,
              arg_keys: tuple[str, ...] = ARG_KEYS) -> tuple[Call, int | None]:
    """The call object `{"name": ..., "arguments": {...}}` opening at text[i] == '{', and where it ends (None
    while open). Any of `arg_keys` may hold the arguments; Invalid for anything that is not a call of one of
    `tools` with an object of arguments, or (complete) an object still open."""
    scan = _scan_object(text, i, ("name", *arg_keys))
    name = None
    if (span := scan.members.get("name")) is not None and span[1] is not None:
        name = loads(text[span[0]:span[1]])
        if not isinstance(name, str) or name not in tools:
            raise Invalid
    arg_spans = [scan.members[k] for k in arg_keys if k in scan.members]
    if len(arg_spans) > 1:
        raise Invalid
    args = ""
    if arg_spans:
        start, end = arg_spans[0]
        if text[start] != "{":
            raise Invalid
        args = text[start:end if end is not None else len(text)]
    if scan.end is None:
        if complete:
            raise Invalid
        return Call(name, args, False), None
    obj = loads(text[i:scan.end])
    given = [obj[k] for k in arg_keys if k in obj]
    if name is None or not all(isinstance(v, dict) for v in given):
        raise Invalid
    return Call(name, args or "{}", True), scan.end


def call_objects(text: str, start: int, final: bool, tools: ToolSet, array: bool,
                 arg_keys: tuple[str, ...] = ARG_KEYS, separators: str = ",;") -> tuple[list[Call], int | None]:
    """Calls written as JSON objects from text[start]: an array of them, or objects separated by one of
    `separators`. Returns the calls and where the array ends (None while open, or when not an array)."""
    calls: list[Call] = []
    i = ws(text, start)
    if array:
        if i == len(text):
            if final:
                raise Invalid
            return calls, None
        if text[i] != "[":
            raise Invalid
        i = ws(text, i + 1)
    while i < len(text):
        if text[i] == "]" and array:
            return calls, i + 1
        if text[i] != "{":
            raise Invalid
        call, end = read_call(text, i, final, tools, arg_keys)
        calls.append(call)
        if end is None:
            return calls, None
        i = ws(text, end)
        if i < len(text) and text[i] in separators:
            i = ws(text, i + 1)
    if final and array:
        raise Invalid  # the closing bracket never came
    return calls, None
