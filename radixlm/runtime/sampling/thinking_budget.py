"""Thinking budget (SGLang's `thinking_budget`, vLLM's `thinking_token_budget`): once a request has written `budget`
tokens inside its reasoning block without closing it, the family's end-of-reasoning tokens are forced one by one
(every other logit -inf), and the model then goes on with its answer.

The block: one the prompt leaves open (its last start tag after its last end tag) or that the reply starts in (the
family's rule, or the chat layer's reasoning parser); or one the model opens with the start tag as its first output
tokens (a start tag there is not counted, as the reasoning parser drops it). The reasoning tokens are the output
tokens after that opening; the block closes where the end tag's (or the family's tool-call tag's) token ids appear in
the output (matched as ids: the families' tags are tokenized as the front tokenizes them alone).

NOTE the overlap rule: whether position p is forced is a function of the output tokens before the forced window's
start F (did the block close before F?) and of counts. ThinkingTracker.forced_token answers UNKNOWN when a token it
needs is still in flight (the host has read fewer than F tokens), and the scheduler then does not plan the request
ahead (scheduler/cursor.py can_plan_ahead): the forced tokens are exactly those of a run without overlap."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence


class Unknown(enum.Enum):
    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN


@dataclass(frozen=True)
class ThinkingBudget:
    """One request's budget, resolved by the front (tags tokenized, the prompt read)."""

    budget: int  # reasoning tokens before the end tag is forced
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    starts_open: bool  # the output starts inside the block
    tool_ids: tuple[int, ...] = ()  # a tool call's start tag, which also closes the block (as the parser reads it)

    def __post_init__(self) -> None:
        if not isinstance(self.budget, int) or isinstance(self.budget, bool) or self.budget < 1:
            raise ValueError(f"thinking_budget must be an integer >= 1, got {self.budget!r}")
        if not self.start_ids or not self.end_ids:
            raise ValueError("thinking budget: the reasoning tags must tokenize to at least one token each")

    @classmethod
    def for_prompt(cls, budget: int, start_ids: Sequence[int], end_ids: Sequence[int], prompt_ids: Sequence[int],
                   always_open: bool, tool_ids: Sequence[int] = ()) -> "ThinkingBudget":
        """always_open: the family's output always starts in the block (else only a block the prompt leaves open, or
        one the model opens, counts)."""
        start, end = tuple(start_ids), tuple(end_ids)
        opened = _last(prompt_ids, start)
        return cls(budget, start, end, always_open or (opened >= 0 and opened > _last(prompt_ids, end)),
                   tuple(tool_ids))


def _last(ids: Sequence[int], tag: tuple[int, ...]) -> int:
    """Index of the last occurrence of `tag` in `ids`, -1 if none."""
    n = len(tag)
    for i in range(len(ids) - n, -1, -1):
        if ids[i] == tag[0] and tuple(ids[i : i + n]) == tag:
            return i
    return -1


@dataclass(frozen=True, slots=True)
class _Scan:
    """What the first `n` output tokens tell."""

    n: int = 0
    opened: bool | None = None  # None: the output so far is a proper prefix of the start tag
    think_from: int = 0  # first reasoning token (when opened)
    decided_at: int = 0  # tokens it took to decide `opened`
    closed_at: int | None = None  # index of the end tag's last token


class ThinkingTracker:
    """A request's budget and its scan of the output tokens the host knows (advanced by Req.append_tokens). Any
    longer output (a draft's rows: the known tokens, then guessed ones) is scanned from it without changing it."""

    __slots__ = ("spec", "_scan")

    def __init__(self, spec: ThinkingBudget):
        self.spec = spec
        self._scan = _Scan()

    @property
    def done(self) -> bool:
        """Nothing is or will be forced (the block closed or never opened): the request samples as without a budget."""
        s = self._scan
        return s.opened is False or s.closed_at is not None

    def advance(self, output_ids: Sequence[int]) -> None:
        """The host's output ids (they only grow)."""
        if len(output_ids) != self._scan.n:
            self._scan = self._peek(output_ids)

    def _peek(self, ids: Sequence[int]) -> _Scan:
        s = self._scan
        if len(ids) == s.n:
            return s
        spec = self.spec
        start, closers = spec.start_ids, [t for t in (spec.end_ids, spec.tool_ids) if t]
        opened, think_from, decided_at, closed_at = s.opened, s.think_from, s.decided_at, s.closed_at
        k = len(start)
        for i in range(s.n, len(ids)):
            if opened is None:
                if ids[i] != start[i]:
                    opened, think_from, decided_at = spec.starts_open, 0, i + 1
                elif i == k - 1:
                    opened, think_from, decided_at = True, k, k
                    continue
                else:
                    continue
            if not opened or closed_at is not None:
                break
            for tag in closers:
                m = len(tag)
                if i >= think_from + m - 1 and ids[i] == tag[-1] and tuple(ids[i - m + 1 : i + 1]) == tag:
                    closed_at = i
                    break
        return _Scan(len(ids), opened, think_from, decided_at, closed_at)

    def forced_token(self, ids: Sequence[int], pos: int) -> int | None | Unknown:
        """The token forced at output position `pos` (None: none), given the output tokens `ids` (len(ids) <= pos:
        the others are in flight); UNKNOWN when that depends on a token in flight."""
        s, spec = self._peek(ids), self.spec
        if s.opened is False:
            return None
        if s.opened is None:
            # The output so far could still be the start tag: nothing is forced before the opening is decided.
            lowest = max((0 if spec.starts_open else len(spec.start_ids)) + spec.budget, len(ids) + 1)
            return None if pos < lowest else UNKNOWN
        first = max(s.think_from + spec.budget, s.decided_at)
        if pos < first:
            return None
        if len(ids) < first:
            return UNKNOWN  # the block may have closed at a position in flight
        if s.closed_at is not None and s.closed_at < first:
            return None
        j = pos - first
        return spec.end_ids[j] if j < len(spec.end_ids) else None

    def decided(self, ids: Sequence[int], pos: int) -> bool:
        """Whether forced_token(ids, pos) is known (the overlap scheduler may plan the request's next pass)."""
        return self.done or self.forced_token(ids, pos) is not UNKNOWN
