"""Whether guessing draft sources draft at all in the next pass, from what drafting was measured to buy.

Per batch-size bucket (powers of two of the running requests), the controller keeps each regime's rate -- drafting
on and off -- in output tokens per request per second of scheduler step (host wall time around Scheduler.step;
with the overlap scheduler a step lasts about as long as a device pass in steady state, and the bubble of a pass
not planned ahead counts too). A rate is the ratio of sums over a window of `window` clean steps (decode passes
only), folded into an exponential average; a window of drafting on starts at a step that verified drafts (steps
with nothing drafted say nothing about drafting: a server with nothing to draft never turns it off). A bucket first measures on, then off;
then it exploits the faster regime (off only where it beats on by `margin`: speculation was asked for) and every
`period` of its steps explores the other regime for one window, the period doubling (to MAX_PERIOD_FACTOR times)
while exploring confirms the choice and resetting when it flips. The first `settle` steps after the regime changes
are not measured: their passes were drafted under the old one."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

EMA_WEIGHT = 0.5  # weight of the newest window in a regime's rate
MAX_PERIOD_FACTOR = 8


def bucket(n: int) -> int:
    """The batch-size bucket of n running requests: 1, 2-3, 4-7, ... (by bit length)."""
    return max(n, 1).bit_length()


@dataclass
class _Window:
    steps: int = 0
    tokens: float = 0.0
    request_seconds: float = 0.0


@dataclass
class _Bucket:
    rate: dict[bool, float] = field(default_factory=dict)  # regime -> output tokens per request-second
    window: dict[bool, _Window] = field(default_factory=lambda: {True: _Window(), False: _Window()})
    period: int = 0  # steps between explorations (set once both regimes are measured)
    since: int = 0  # steps since the last exploration ended
    exploring: bool | None = None  # the regime being measured outside exploitation
    choice: bool | None = None  # the regime exploitation picked last


class DraftController:
    def __init__(self, window: int = 8, margin: float = 0.02, period: int = 64, settle: int = 2,
                 clock: Callable[[], float] = time.perf_counter, stats: Counter | None = None):
        self.window, self.margin, self.period, self.settle = window, margin, period, settle
        self.clock = clock
        self.stats = stats if stats is not None else Counter()
        self.buckets: dict[int, _Bucket] = {}
        self.on = True  # the regime of the current step
        self._current: int | None = None  # the bucket of the current step (None: not measured)
        self._start = 0.0
        self._settling = 0

    def decide(self, n: int) -> bool:
        """At the start of a step whose batch (n running requests) the batch rule lets draft: whether it drafts."""
        b = self.buckets.setdefault(bucket(n), _Bucket())
        on = self._regime(b)
        if on != self.on:
            self._settling = self.settle
            self.on = on
        self.stats["spec_controller_on_steps" if on else "spec_controller_off_steps"] += 1
        self._current = bucket(n)
        self._start = self.clock()
        return on

    def skip(self) -> None:
        """A step the controller has no say in (the batch rule or no drafting source decides): not measured."""
        self._current = None

    def _regime(self, b: _Bucket) -> bool:
        if b.exploring is not None:
            return b.exploring
        for regime in (True, False):
            if regime not in b.rate:
                b.exploring = regime
                return regime
        if b.since >= b.period:
            b.exploring = not self._best(b)
            b.window[b.exploring] = _Window()  # a partial window left from when it was exploited is stale
            self.stats["spec_controller_explorations"] += 1
            return b.exploring
        return self._best(b)

    def _best(self, b: _Bucket) -> bool:
        return not b.rate[False] > b.rate[True] * (1 + self.margin)

    def observe(self, tokens: float, requests: int, drafted: int = 0) -> None:
        """At the end of the step decide() began: `tokens` output tokens of the decode passes it processed, of
        `requests` requests in all (0: no clean decode pass; not measured), `drafted` tokens of theirs verified
        drafts (of the sources the controller gates)."""
        if self._current is None:
            return
        b, self._current = self.buckets[self._current], None
        seconds = self.clock() - self._start
        if b.exploring is None:
            b.since += 1
        if self._settling:
            self._settling -= 1
            return
        if requests <= 0 or seconds <= 0:
            return
        w = b.window[self.on]
        if self.on and not w.steps and not drafted:
            return
        w.steps += 1
        w.tokens += tokens
        w.request_seconds += seconds * requests
        if w.steps >= self.window:
            self._fold(b, self.on, w.tokens / w.request_seconds)
            b.window[self.on] = _Window()

    def _fold(self, b: _Bucket, regime: bool, rate: float) -> None:
        old = b.rate.get(regime)
        b.rate[regime] = rate if old is None else old + EMA_WEIGHT * (rate - old)
        explored = b.exploring == regime
        if explored:
            b.exploring, b.since = None, 0
        if len(b.rate) < 2:
            return
        best = self._best(b)
        if best != b.choice:
            if b.choice is not None:
                self.stats["spec_controller_flips"] += 1
            b.choice, b.period, b.since = best, self.period, 0
        elif explored:
            b.period = min(2 * b.period, MAX_PERIOD_FACTOR * self.period)

    def state(self) -> dict[int, dict]:
        """Per bucket (bit length of the batch size): its rates and what it drafts now (tests, debugging)."""
        return {k: {"rate_on": b.rate.get(True), "rate_off": b.rate.get(False), "choice": b.choice,
                    "exploring": b.exploring, "period": b.period} for k, b in self.buckets.items()}
