"""Per-request draft length from acceptance history (sources with adaptive_length, e.g. a draft model, whose every
draft token costs a draft pass as well as a verification row)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

EMA_WEIGHT = 0.5  # weight of the latest verdict in the moving average


@dataclass
class DraftLength:
    """An exponential moving average of the draft tokens a request kept per verdict; the next draft is one token
    longer than that (a probe: a draft kept whole lets the next grow by one), within [1, max_len]. It starts at
    max_len (optimistic): each wholly rejected draft about halves the average, so a request the drafts miss falls
    to 1-token drafts within a few steps (where lookup sources back off, spec/backoff.py, this one shortens)."""

    max_len: int
    kept: float = field(default=-1.0)  # the average; -1: no verdict yet

    def __post_init__(self) -> None:
        if self.kept < 0:
            self.kept = float(self.max_len - 1)

    def next_len(self) -> int:
        return max(1, min(self.max_len, math.floor(self.kept + 0.5) + 1))

    def update(self, drafted: int, accepted: int) -> None:
        """A verdict: `accepted` of `drafted` tokens kept."""
        if drafted <= 0:
            return
        self.kept += EMA_WEIGHT * (accepted - self.kept)
