"""What every tool-call format shares: the segments a format splits text into, the format interface, and the
pieces of xgrammar structural tags the formats build their constraints from.

A format reads text with one pure function `frame(text, final, tools)` that splits the text so far into content
strings and calls. Streaming re-frames the growing text and sends what is new, so it relies on two rules every
format keeps: the content of a prefix is a prefix of the content of the whole, and a call's `args` only grow."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A function's name -> the JSON schema of its parameters (None: any object). Names outside it are not calls.
ToolSet = Mapping[str, "dict | None"]

# Runs of whitespace inside constrained arguments are capped: a small model may otherwise loop on them. JSON
# arguments get one at a time (xgrammar takes no 0: no indentation runs): a small model
# spent a 40-token budget on indentation before the first value.
MAX_WHITESPACE = 8
MAX_WHITESPACE_JSON = 1


class Invalid(Exception):
    """The text cannot become a call of this format, whatever follows."""


@dataclass
class Call:
    """One call as far as the text goes: name None until it is complete; args is its JSON text so far."""

    name: str | None
    args: str
    done: bool


Segment = str | Call


def toolset(tools: ToolSet | Iterable[str]) -> ToolSet:
    """A ToolSet from a mapping, or from bare names (no schemas: every argument value kept as the model wrote it)."""
    return tools if isinstance(tools, Mapping) else {name: None for name in tools}


def held(text: str, *tags: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of one of the tags (held back until decided)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if tag.startswith(text[-n:]):
                best = n
                break
    return best


def find_first(text: str, tags: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest occurrence at or after start of any of the tags: (position, tag)."""
    hits = [(k, tag) for tag in tags if (k := text.find(tag, start)) >= 0]
    return min(hits, key=lambda h: (h[0], -len(h[1]))) if hits else None


def frame_tagged(text: str, final: bool, call_open: str,
                 read: Callable[[int], tuple[Call, int | None]], clean: Callable[[str, bool], str]) -> list[Segment]:
    """The frame of formats whose calls each start with `call_open`. read(k) reads the call opening at text[k]
    (where it ends; None while it may go on) or raises Invalid; text from a malformed call to the next opening
    stays content. clean(content, complete) is the content the client sees."""
    out: list[Segment] = []
    pos = 0
    while True:
        k = text.find(call_open, pos)
        if k < 0:
            out.append(clean(text[pos:], final))
            return out
        between = text[pos:k]
        out.append("" if out and isinstance(out[-1], Call) and not between.strip() else clean(between, True))
        try:
            call, end = read(k)
        except Invalid:
            nxt = text.find(call_open, k + 1)
            end = nxt if nxt >= 0 else len(text)
            out.append(clean(text[k:end], final or nxt >= 0))
            if nxt < 0:
                return out
            pos = nxt
            continue
        out.append(call)
        if end is None:
            return out
        pos = end


@dataclass(frozen=True)
class ToolSpec:
    """One function a constraint lets the model call."""

    name: str
    parameters: dict | None


class ToolCallFormat(ABC):
    """One family's text format of tool calls."""

    # The format's tags are special tokens of its tokenizer: the output must be detokenized keeping them.
    special_markers = False

    @abstractmethod
    def frame(self, text: str, final: bool, tools: ToolSet) -> list[Segment]:
        """Content strings and calls, in order, of the text so far (final: the model has stopped).

        Never raises: text that is not a call of one of `tools` comes back as content."""

    def call_tags(self, tools: Sequence[ToolSpec]) -> CallTags | None:
        """The structural tags of one call of each tool in this format; None: xgrammar cannot express it."""
        return None


# ---- xgrammar structural tags, written as the JSON that xgrammar.StructuralTag reads ----

def const(value: str) -> dict:
    return {"type": "const_string", "value": value}


def json_args(parameters: dict | None, style: str = "json") -> dict:
    schema: Any = parameters if parameters else {"type": "object"}
    spaces = MAX_WHITESPACE_JSON if style == "json" else MAX_WHITESPACE
    return {"type": "json_schema", "json_schema": schema, "style": style, "max_whitespace_cnt": spaces}


def tag(begin: str, content: dict, end: str) -> dict:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


@dataclass(frozen=True)
class CallTags:
    """Calls as structural tags: `prefix`, then the calls joined by `separator`, then `suffix`. `trigger` starts
    every call's begin tag, so that free text may come before the calls when they are optional."""

    tags: tuple[dict, ...]
    trigger: str
    separator: str = ""
    prefix: str = ""
    suffix: str = ""

    def forced(self, parallel: bool) -> dict:
        """Calls and nothing else: at least one; exactly one unless parallel."""
        calls = {"type": "tags_with_separator", "tags": list(self.tags), "separator": self.separator,
                 "at_least_one": True, "stop_after_first": not parallel}
        return _sequence([const(self.prefix)] if self.prefix else [], calls,
                         [const(self.suffix)] if self.suffix else [])

    def optional_single(self) -> dict:
        """Free text, then at most one call, after which the output ends."""
        if self.prefix or self.suffix:
            # a section around the calls: the section's opening tag triggers the one call inside it
            inner = {"type": "tags_with_separator", "tags": list(self.tags), "separator": self.separator,
                     "at_least_one": True, "stop_after_first": True}
            section = tag(self.prefix, inner, self.suffix)
            return {"type": "triggered_tags", "triggers": [self.prefix], "tags": [section],
                    "at_least_one": False, "stop_after_first": True}
        return {"type": "triggered_tags", "triggers": [self.trigger], "tags": list(self.tags),
                "at_least_one": False, "stop_after_first": True}


def _sequence(before: list[dict], middle: dict, after: list[dict]) -> dict:
    elements = [*before, middle, *after]
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}
