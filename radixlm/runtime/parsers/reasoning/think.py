"""Reasoning between a start and an end tag (`<think>…</think>`, `◁think▷…◁/think▷`): DeepSeek-R1, Qwen3,
GLM-4.5, Kimi and the families that share their tags.

The output has at most one reasoning block, at its start:
- the block is open from the first character when the chat template opened it (`starts_in_reasoning`), or when the
  output begins with the start tag (whitespace before it is dropped with it; a model that echoes the tag the template
  already wrote has it dropped the same way);
- it ends at the end tag (dropped) or at the family's tool-call start (kept: it belongs to the content, where the
  tool-call parser finds it), whichever comes first;
- everything after it is content, tags included; an output cut before the block ends is all reasoning."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from radixlm.runtime.parsers.reasoning.base import Split, first_marker, partial_marker_len


@dataclass(frozen=True)
class ThinkTags:
    start: str
    end: str
    tool_start: str | None = None  # a tool call that closes the reasoning when the model skips the end tag

    def __post_init__(self) -> None:
        if not self.start or not self.end or self.tool_start == "":
            raise ValueError("ThinkTags: start, end and tool_start (when set) must be non-empty")

    @property
    def closers(self) -> tuple[str, ...]:
        return (self.end,) if self.tool_start is None else (self.end, self.tool_start)


class _Phase(enum.Enum):
    OPENING = "opening"  # at the start: whitespace and a possible start tag are held until they decide
    REASONING = "reasoning"
    CONTENT = "content"


class ThinkDetector:
    def __init__(self, tags: ThinkTags, starts_in_reasoning: bool):
        self.tags = tags
        self.starts_in_reasoning = starts_in_reasoning
        self._phase = _Phase.OPENING
        self._held = ""

    def feed(self, text: str) -> Split:
        buf, reasoning, content = self._held + text, [], []
        while True:
            if self._phase is _Phase.OPENING:
                rest = buf.lstrip()
                if rest.startswith(self.tags.start):
                    buf, self._phase = rest[len(self.tags.start):], _Phase.REASONING
                elif self.tags.start.startswith(rest):
                    break  # only whitespace and part of the start tag so far
                else:
                    self._phase = _Phase.REASONING if self.starts_in_reasoning else _Phase.CONTENT
            elif self._phase is _Phase.REASONING:
                i, marker = first_marker(buf, self.tags.closers)
                if marker is None:
                    keep = partial_marker_len(buf, self.tags.closers)
                    reasoning.append(buf[:len(buf) - keep])
                    buf = buf[len(buf) - keep:]
                    break
                reasoning.append(buf[:i])
                buf = buf[i + len(marker):] if marker == self.tags.end else buf[i:]
                self._phase = _Phase.CONTENT
            else:
                content.append(buf)
                buf = ""
                break
        self._held = buf
        return Split("".join(reasoning), "".join(content))

    def finish(self) -> Split:
        held, self._held = self._held, ""
        if self._phase is _Phase.REASONING or (self._phase is _Phase.OPENING and self.starts_in_reasoning):
            return Split(reasoning=held)
        return Split(content=held)
