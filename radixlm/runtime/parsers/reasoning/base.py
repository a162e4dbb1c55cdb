"""What every reasoning detector returns, and the hold-back rule that makes streaming exact.

A detector is fed the model's text in pieces of any size and returns, for each piece, the reasoning and the content
it can already tell apart; `finish` returns what it held back. Whatever the pieces, the concatenated results equal
those of feeding the whole text at once: a detector only holds back a suffix that could still become one of its
markers, and decides everything else from the text alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Split:
    """A model output (or a piece of one) split into its reasoning and its content (the answer)."""

    reasoning: str = ""
    content: str = ""

    def __add__(self, other: Split) -> Split:
        return Split(self.reasoning + other.reasoning, self.content + other.content)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class Detector(Protocol):
    def feed(self, text: str) -> Split: ...

    def finish(self) -> Split: ...


def partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers` (0: none)."""
    longest = max((len(m) for m in markers), default=0)
    for n in range(min(len(text), longest - 1), 0, -1):
        tail = text[-n:]
        if any(len(m) > n and m.startswith(tail) for m in markers):
            return n
    return 0


def first_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    """(index, marker) of the earliest complete marker in `text`; (-1, None) when there is none."""
    best, found = -1, None
    for m in markers:
        i = text.find(m)
        if i != -1 and (best == -1 or i < best):
            best, found = i, m
    return best, found
