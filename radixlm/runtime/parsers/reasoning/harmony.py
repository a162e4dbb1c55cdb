"""OpenAI's harmony format (gpt-oss): the output is a sequence of messages, each a header and a body.

    <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{…}<|call|>

The first message's `<|start|>assistant` is the prompt's. The analysis channel is reasoning; final and commentary
without a recipient (a preamble to the user) are content; a message with a recipient (`to=…`, in the role or the
channel part of the header) is a tool call, passed to the content whole, markers included, for the tool-call parser.
Text before any header is content; a header cut off before `<|message|>` is dropped. The markers are special tokens:
the output must be detokenized with them (ReasoningFamily.keeps_special_tokens)."""
from __future__ import annotations

import enum
import re

from radixlm.runtime.parsers.reasoning.base import Split, first_marker, partial_marker_len

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
TERMINATORS = (END, RETURN, CALL)
HEADS = (START, CHANNEL)
BODY_STOPS = (*TERMINATORS, *HEADS)  # a body ends at a terminator, or (malformed) where a new header begins
MAX_HEADER_CHARS = 512  # <|message|> further on: not a header, the text is content as written
_RECIPIENT = re.compile(r"\bto=[^\s<]+")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")


class _Kind(enum.Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    TOOL = "tool"  # content, raw


def _kind(header: str) -> _Kind:
    if _RECIPIENT.search(header):
        return _Kind.TOOL
    m = _CHANNEL.search(header)
    return _Kind.REASONING if m is not None and m.group(1) == "analysis" else _Kind.CONTENT


class HarmonyDetector:
    def __init__(self) -> None:
        self._body: _Kind | None = None  # None: between messages (reading a header, if any)
        self._held = ""

    def feed(self, text: str) -> Split:
        buf, reasoning, content = self._held + text, [], []
        while buf:
            if self._body is None:
                term = next((t for t in TERMINATORS if buf.startswith(t)), None)
                i = buf.find(MESSAGE)
                if term is not None:  # a stray terminator between messages
                    buf = buf[len(term):]
                elif any(buf.startswith(h) for h in HEADS) and 0 <= i <= MAX_HEADER_CHARS:
                    header, buf = buf[:i], buf[i + len(MESSAGE):]
                    self._body = _kind(header)
                    if self._body is _Kind.TOOL:
                        content.append(header + MESSAGE)
                elif any(m.startswith(buf) for m in (*HEADS, *TERMINATORS)) or (
                        any(buf.startswith(h) for h in HEADS) and i == -1
                        and len(buf) < MAX_HEADER_CHARS + len(MESSAGE)):
                    break  # a header (or a marker) still arriving
                else:  # not harmony markup: plain content up to the next header or terminator
                    head = next((h for h in HEADS if buf.startswith(h)), "")
                    content.append(head)
                    buf, self._body = buf[len(head):], _Kind.CONTENT
            else:
                i, marker = first_marker(buf, BODY_STOPS)
                if marker is None:
                    keep = partial_marker_len(buf, BODY_STOPS)
                    self._emit(buf[:len(buf) - keep], reasoning, content)
                    buf = buf[len(buf) - keep:]
                    break
                self._emit(buf[:i], reasoning, content)
                if marker in TERMINATORS:
                    if self._body is _Kind.TOOL:
                        content.append(marker)
                    buf = buf[i + len(marker):]
                else:
                    buf = buf[i:]
                self._body = None
        self._held = buf
        return Split("".join(reasoning), "".join(content))

    def _emit(self, text: str, reasoning: list[str], content: list[str]) -> None:
        (reasoning if self._body is _Kind.REASONING else content).append(text)

    def finish(self) -> Split:
        held, self._held = self._held, ""
        if self._body is None:
            return Split()  # a header without its body
        return Split(reasoning=held) if self._body is _Kind.REASONING else Split(content=held)
