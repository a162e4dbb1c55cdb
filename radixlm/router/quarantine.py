"""Requests suspected of killing their workers, by fingerprint (a hash of the route and the body bytes).

A worker that broke while it had a request (Delivery.MAYBE_READ) makes the request a suspect: every attempt with
its fingerprint from then on (its one resend, and copies that clients send) may reach only one other worker, the
first one picked after the death (the pin). If a second worker breaks while it has it, the fingerprint is
quarantined: copies are refused at the router until the quarantine expires. So one poison request, and all its
copies, can take down at most two workers (those it reached before its first death aside: copies already in
flight then cannot be called back). Any answer from a worker that is not a failure clears the suspicion (the
worker died of something else). The store is bounded (oldest entries go first) and every entry expires."""
from __future__ import annotations

import enum
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from radixlm.router.failures import Delivery

MAX_ENTRIES = 4096


def fingerprint(route: str, body: bytes) -> bytes:
    return hashlib.blake2b(route.encode() + b"\0" + body, digest_size=16).digest()


class Verdict(enum.Enum):
    CLEAR = "clear"
    SUSPECT = "suspect"  # one worker broke while it had it
    QUARANTINED = "quarantined"  # two did: copies are refused


@dataclass
class Suspect:
    expires_at: float
    dead: list[str] = field(default_factory=list)  # workers that broke while they had it, in order
    pinned: str | None = None  # the one other worker attempts may reach (set by sent())
    in_flight: int = 0  # attempts sent to `pinned` since the first death that have not ended

    @property
    def quarantined(self) -> bool:
        return len(self.dead) >= 2


class QuarantineStore:
    def __init__(self, ttl_s: float, max_entries: int = MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._entries: OrderedDict[bytes, Suspect] = OrderedDict()

    def _get(self, fp: bytes) -> Suspect | None:
        e = self._entries.get(fp)
        if e is not None and self.clock() >= e.expires_at:
            del self._entries[fp]
            return None
        return e

    def verdict(self, fp: bytes) -> Verdict:
        e = self._get(fp)
        if e is None:
            return Verdict.CLEAR
        return Verdict.QUARANTINED if e.quarantined else Verdict.SUSPECT

    def dead(self, fp: bytes) -> list[str]:
        e = self._get(fp)
        return list(e.dead) if e is not None else []

    def candidates(self, fp: bytes, urls: list[str]) -> list[str]:
        """Which of the workers `urls` (eligible, not yet tried) the next attempt with `fp` may go to."""
        e = self._get(fp)
        if e is None:
            return urls
        if e.quarantined:
            return []
        urls = [u for u in urls if u not in e.dead]
        if e.pinned is not None:
            if e.pinned in urls:
                return [e.pinned]
            if e.in_flight:
                return []  # the pin is out of reach, but attempts on it may still break it: no second pin yet
        return urls

    def sent(self, fp: bytes, url: str) -> bool:
        """An attempt with `fp` goes to `url`. Returns whether it counts against a suspect (pass it to ended())."""
        e = self._get(fp)
        if e is None or e.quarantined:
            return False
        e.pinned = url
        e.in_flight += 1
        return True

    def untrack(self, fp: bytes, url: str, tracked: bool) -> Suspect | None:
        """An attempt that sent() counted is over, whatever became of it. Returns the entry, if any."""
        e = self._get(fp)
        if e is not None and tracked and e.pinned == url and e.in_flight:
            e.in_flight -= 1
        return e

    def ended(self, fp: bytes, url: str, tracked: bool, delivery: Delivery | None) -> bool:
        """An attempt with `fp` on `url` ended: `delivery` None for an answer that is no failure. Returns whether
        this ended it in quarantine."""
        e = self.untrack(fp, url, tracked)
        if delivery is None:
            if e is not None and not e.quarantined:
                del self._entries[fp]
            return False
        if delivery is not Delivery.MAYBE_READ:
            return False
        if e is None:
            e = self._entries[fp] = Suspect(self.clock() + self.ttl_s)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        if url in e.dead or e.quarantined:
            return False
        e.dead.append(url)
        e.expires_at = self.clock() + self.ttl_s
        self._entries.move_to_end(fp)
        return e.quarantined

    def counts(self) -> dict[str, int]:
        now = self.clock()
        live = [e for e in self._entries.values() if now < e.expires_at]
        quarantined = sum(e.quarantined for e in live)
        return {"quarantined": quarantined, "suspected": len(live) - quarantined}
