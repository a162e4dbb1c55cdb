"""Backing off where drafts are rejected outright (shared by the lookup sources: NGRAM, RADIX)."""
from __future__ import annotations

from dataclasses import dataclass

MAX_BACKOFF = 16


@dataclass
class Backoff:
    """A draft the model rejects outright costs its verification rows for nothing: after one, the request drafts
    again only after 1, 2, 4, ... MAX_BACKOFF steps while that repeats; a draft with any token kept resets the wait."""

    backoff: int = 0  # steps without a draft after the next wholly rejected one
    skip: int = 0  # steps left without a draft

    def waiting(self) -> bool:
        """Whether this step goes without a draft (counts the step)."""
        if self.skip:
            self.skip -= 1
            return True
        return False

    def learn(self, accepted: int) -> bool:
        """The verdict on a draft; returns whether the request now backs off."""
        if accepted:
            self.backoff = 0
            return False
        self.backoff = min(max(1, 2 * self.backoff), MAX_BACKOFF)
        self.skip = self.backoff
        return True
