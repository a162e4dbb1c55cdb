"""Tool calls in model text: the hermes / Qwen2.5 `<tool_call>` format, Llama-3.1 JSON, and the JSON array that
tool_choice=required / a named function is constrained to.

Every format is read by one pure function `frame(text, final)` that splits the text so far into content and
calls. Streaming re-frames the growing text and sends what is new, so the streamed deltas add up to exactly what
the non-streamed parse of the whole text gives. A call's arguments are the model's own JSON text of the
arguments object (not re-serialised), which is what makes a prefix of them streamable."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
ARG_KEYS = ("arguments", "parameters")
CALL_KEYS = ("name", *ARG_KEYS)
FORMATS = ("hermes", "llama3", "json_array")


class _Invalid(Exception):
    """The text cannot become a JSON object, whatever follows."""


@dataclass
class Call:
    """One call as far as the text goes: name None until its string is complete; args is its raw JSON so far."""

    name: str | None
    args: str
    done: bool


Segment = str | Call


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
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


def _value_end(text: str, i: int) -> int | None:
    """End of the JSON value starting at text[i]; None if the text stops inside it. Brackets are matched, not
    validated: json.loads checks the complete call."""
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = _string_end(text, i)
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


@dataclass
class _ObjectScan:
    end: int | None  # end of the object, None while open
    members: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # key -> value span


def _scan_object(text: str, i: int) -> _ObjectScan:
    """Top-level members of the object opening at text[i] == '{' (keys other than a call's are invalid)."""
    scan = _ObjectScan(None)
    i = _ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        scan.end = i + 1
        return scan
    while i < len(text):
        if text[i] != '"':
            raise _Invalid
        key_end = _string_end(text, i)
        if key_end is None:
            if not any(k.startswith(text[i + 1:]) for k in CALL_KEYS):
                raise _Invalid
            return scan
        key = json.loads(text[i:key_end])
        if key not in CALL_KEYS:
            raise _Invalid
        i = _ws(text, key_end)
        if i == len(text):
            return scan
        if text[i] != ":":
            raise _Invalid
        i = _ws(text, i + 1)
        if i == len(text):
            return scan
        end = _value_end(text, i)
        scan.members[key] = (i, end)
        if end is None:
            return scan
        i = _ws(text, end)
        if i == len(text):
            return scan
        if text[i] == "}":
            scan.end = i + 1
            return scan
        if text[i] != ",":
            raise _Invalid
        i = _ws(text, i + 1)
    return scan


def _read_call(text: str, i: int, complete: bool, tools: frozenset[str]) -> tuple[Call, int | None]:
    """The call whose object opens at text[i] == '{', and where the object ends (None while open).

    complete: no more text will come, so an open object is invalid. Raises _Invalid for anything that is not a
    call of one of `tools` with an object of arguments."""
    scan = _scan_object(text, i)
    name = None
    if (span := scan.members.get("name")) is not None and span[1] is not None:
        name = json.loads(text[span[0]:span[1]])
        if not isinstance(name, str) or name not in tools:
            raise _Invalid
    arg_spans = [scan.members[k] for k in ARG_KEYS if k in scan.members]
    if len(arg_spans) > 1:
        raise _Invalid
    args = ""
    if arg_spans:
        start, end = arg_spans[0]
        if text[start] != "{":
            raise _Invalid
        args = text[start:end if end is not None else len(text)]
    if scan.end is None:
        if complete:
            raise _Invalid
        return Call(name, args, False), None
    try:
        obj = json.loads(text[i:scan.end])
    except ValueError:
        raise _Invalid from None
    if name is None or not isinstance(obj.get(ARG_KEYS[0], obj.get(ARG_KEYS[1], {})), dict):
        raise _Invalid
    return Call(name, args or "{}", True), scan.end


def _held(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag (held back until decided)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _frame_hermes(text: str, final: bool, tools: frozenset[str]) -> list[Segment]:
    # Small Qwen models sometimes drop the tags and answer with the bare call object: an output that is
    # nothing but calls of the given tools counts as calls.
    if text.lstrip().startswith("{"):
        try:
            return ["", *_frame_objects(text, 0, final, tools, array=False)]
        except _Invalid:
            pass
    out: list[Segment] = []
    pos = 0
    while True:
        k = text.find(HERMES_OPEN, pos)
        if k < 0:
            tail = text[pos:]
            out.append(tail if final else tail[:len(tail) - _held(tail, HERMES_OPEN)])
            return out
        out.append(text[pos:k])
        body_start = k + len(HERMES_OPEN)
        e = text.find(HERMES_CLOSE, body_start)
        closed = e >= 0
        body = text[body_start:e if closed else len(text)]
        if not closed and not final:
            body = body[:len(body) - _held(body, HERMES_CLOSE)]
        try:
            i = _ws(body, 0)
            if i == len(body):
                if closed or final:
                    raise _Invalid
                out.append(Call(None, "", False))
            elif body[i] != "{":
                raise _Invalid
            else:
                call, end = _read_call(body, i, closed or final, tools)
                if end is not None and body[end:].strip():
                    raise _Invalid
                call.done = closed or (final and call.done)
                out.append(call)
        except _Invalid:
            out.append(text[k:e + len(HERMES_CLOSE) if closed else len(text)])
        if not closed:
            return out
        pos = e + len(HERMES_CLOSE)


def _frame_objects(text: str, start: int, final: bool, tools: frozenset[str], array: bool) -> list[Call]:
    """Calls written as JSON objects from text[start]: an array of them, or (Llama) objects separated by ';'."""
    calls: list[Call] = []
    i = _ws(text, start)
    if array:
        if i == len(text):
            return calls
        if text[i] != "[":
            raise _Invalid
        i = _ws(text, i + 1)
    while i < len(text):
        if text[i] == "]" and array:
            if _ws(text, i + 1) != len(text):
                raise _Invalid
            return calls
        if text[i] != "{":
            raise _Invalid
        call, end = _read_call(text, i, final, tools)
        calls.append(call)
        if end is None:
            return calls
        i = _ws(text, end)
        if i < len(text) and text[i] in (",", ";"):
            i = _ws(text, i + 1)
    if final and array:
        raise _Invalid  # the closing bracket never came
    return calls


def _frame_llama3(text: str, final: bool, tools: frozenset[str]) -> list[Segment]:
    k = text.find(PYTHON_TAG)
    if k >= 0:
        prefix, start = text[:k], k + len(PYTHON_TAG)
    else:
        stripped = text.lstrip()
        if not final and (not stripped or PYTHON_TAG.startswith(stripped)):
            return [""]
        if not stripped.startswith("{"):
            return [text if final else text[:len(text) - _held(text, PYTHON_TAG)]]
        prefix, start = "", 0
    try:
        return [prefix, *_frame_objects(text, start, final, tools, array=False)]
    except _Invalid:
        return [text]


def frame(fmt: str, text: str, final: bool, tools: frozenset[str]) -> list[Segment]:
    """Content strings and calls, in order, of the text so far (final: the model has stopped)."""
    if fmt == "hermes":
        return _frame_hermes(text, final, tools)
    if fmt == "llama3":
        return _frame_llama3(text, final, tools)
    if fmt == "json_array":
        try:
            return list(_frame_objects(text, 0, final, tools, array=True))
        except _Invalid:
            return [text]
    raise ValueError(f"unknown tool call format {fmt!r}")


def content_of(segments: list[Segment], final: bool) -> str:
    """The message content: text outside calls, trimmed. While streaming, trailing whitespace waits (it may
    precede a call), so what is sent is always a prefix of the final content."""
    text = "".join(s for s in segments if isinstance(s, str)).lstrip()
    return text.strip() if final else text.rstrip()


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass
class Parsed:
    content: str | None
    calls: list[ParsedCall]


def parse(fmt: str, text: str, tools: frozenset[str]) -> Parsed:
    """The complete output: content (None when empty) and the calls."""
    segments = frame(fmt, text, True, tools)
    calls = [ParsedCall(s.name, s.args) for s in segments if isinstance(s, Call) and s.name is not None and s.done]
    return Parsed(content_of(segments, True) or None, calls)


@dataclass
class StreamDelta:
    content: str
    calls: list[dict]  # OpenAI tool_call deltas (without ids: the caller adds them to the first of each call)


@dataclass
class ToolCallStreamer:
    """Turns the growing text of one sample into content and tool-call deltas."""

    fmt: str
    tools: frozenset[str]
    sent_content: str = ""
    sent_args: list[int] = field(default_factory=list)  # per call whose header was sent: argument chars sent

    def feed(self, text: str, final: bool) -> StreamDelta:
        segments = frame(self.fmt, text, final, self.tools)
        delta = StreamDelta("", [])
        content = content_of(segments, final)
        if content.startswith(self.sent_content):
            delta.content = content[len(self.sent_content):]
            self.sent_content = content
        calls = [s for s in segments if isinstance(s, Call)]
        for index, call in enumerate(calls):
            if call.name is None or not (call.args or call.done):
                break  # a call is announced once its arguments begin: keys after the name may still void it
            if index == len(self.sent_args):
                self.sent_args.append(0)
                delta.calls.append({"index": index, "type": "function",
                                    "function": {"name": call.name, "arguments": ""}})
            if len(call.args) > self.sent_args[index]:
                delta.calls.append({"index": index, "function": {"arguments": call.args[self.sent_args[index]:]}})
                self.sent_args[index] = len(call.args)
        return delta

    @property
    def called(self) -> bool:
        return bool(self.sent_args)
