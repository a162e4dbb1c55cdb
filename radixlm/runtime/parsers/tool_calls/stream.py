"""Parsing a finished output, and streaming: the growing text of one sample turned into content and tool-call
deltas that add up to exactly what the parse of the whole text gives."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from radixlm.runtime.parsers.tool_calls.core import Call, Segment, ToolCallFormat, ToolSet, toolset
from radixlm.runtime.parsers.tool_calls.registry import get_format


def _format(fmt: str | ToolCallFormat) -> ToolCallFormat:
    return get_format(fmt) if isinstance(fmt, str) else fmt


def frame(fmt: str | ToolCallFormat, text: str, final: bool, tools: ToolSet | Iterable[str]) -> list[Segment]:
    """Content strings and calls, in order, of the text so far (final: the model has stopped)."""
    return _format(fmt).frame(text, final, toolset(tools))


def content_of(segments: list[Segment], final: bool) -> str:
    """The message content: text outside calls, trimmed. While streaming, trailing whitespace waits (it may
    precede a call), so what is sent is always a prefix of the final content."""
    text = "".join(s for s in segments if isinstance(s, str)).lstrip()
    return text.strip() if final else text.rstrip()


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class Parsed:
    content: str | None
    calls: list[ParsedCall]


def parse(fmt: str | ToolCallFormat, text: str, tools: ToolSet | Iterable[str],
          max_calls: int | None = None) -> Parsed:
    """The complete output: content (None when empty) and the calls (the first `max_calls` of them)."""
    segments = frame(fmt, text, True, tools)
    calls = [ParsedCall(s.name, s.args) for s in segments if isinstance(s, Call) and s.name is not None and s.done]
    return Parsed(content_of(segments, True) or None, calls[:max_calls])


@dataclass
class StreamDelta:
    content: str
    calls: list[dict]  # OpenAI tool_call deltas (without ids: the caller adds them to the first of each call)


@dataclass
class ToolCallStreamer:
    """Turns the growing text of one sample into content and tool-call deltas."""

    fmt: str | ToolCallFormat
    tools: ToolSet | Iterable[str]
    max_calls: int | None = None
    sent_content: str = ""
    sent: list[tuple[str, str]] = field(default_factory=list)  # per call announced: its name, the arguments sent
    # A call already announced turned out malformed (the model's text went wrong after it began): no call deltas
    # follow, so none is ever attributed to the wrong call; the rest of the text comes as content.
    diverged: bool = False

    def __post_init__(self):
        self.fmt, self.tools = _format(self.fmt), toolset(self.tools)

    def feed(self, text: str, final: bool) -> StreamDelta:
        segments = self.fmt.frame(text, final, self.tools)
        delta = StreamDelta("", [])
        content = content_of(segments, final)
        if content.startswith(self.sent_content):
            delta.content = content[len(self.sent_content):]
            self.sent_content = content
        calls = [s for s in segments if isinstance(s, Call)][:self.max_calls]
        for index, call in enumerate(calls):
            if self.diverged or call.name is None or not (call.args or call.done):
                break  # a call is announced once its arguments begin: keys after the name may still void it
            if index == len(self.sent):
                self.sent.append((call.name, ""))
                delta.calls.append({"index": index, "type": "function",
                                    "function": {"name": call.name, "arguments": ""}})
            name, args = self.sent[index]
            if name != call.name or not call.args.startswith(args):
                self.diverged = True
                break
            if len(call.args) > len(args):
                delta.calls.append({"index": index, "function": {"arguments": call.args[len(args):]}})
                self.sent[index] = (name, call.args)
        if len(calls) < len(self.sent):
            self.diverged = True
        return delta

    @property
    def called(self) -> bool:
        return bool(self.sent)
