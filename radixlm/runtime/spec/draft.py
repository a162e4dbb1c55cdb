"""The contract between the draft path (spec/path.py) and a draft source: the Draft a source proposes, the traits
it declares, and every hook the draft path calls. A source overrides the hooks its traits say it uses; the others
keep their defaults."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from radixlm.runtime.scheduler.planner import ScheduleBatch
    from radixlm.runtime.scheduler.req import Req

UNBOUNDED = 1 << 30


@dataclass(frozen=True, slots=True)
class DraftTraits:
    """What a source is, read once by the draft path (spec/path.py has the rules each one enters)."""

    # Its drafts are guesses: the batch rule (DraftPath.draft_cap) and the controller bind them. Exact drafts
    # (grammar jump-forward's forced text) are not.
    batch_adaptive: bool = True
    # It drafts while a pass of the request is in flight, from the tokens known so far (the first guesses it).
    guesses: bool = False
    # It proposes for a processed pass's requests together: propose() queues those it is `ready` for, and
    # DraftPath.flush hands them to propose_batch.
    deferred: bool = False
    # Its draft lengths follow each request's acceptance (spec/adaptive.py), up to max_len.
    adaptive_length: bool = False
    max_len: int = UNBOUNDED
    sees_launch: bool = False  # on_launch: every pass launched
    sees_processed: bool = False  # on_processed: every pass processed


class DraftSource(ABC):
    """Proposes tokens for a request (req.kv.draft); the pass after verifies them."""

    traits: DraftTraits = DraftTraits()  # a class's, or an instance's own (set in its __init__)

    def applies_to(self, req: "Req") -> bool:
        """Whether the request drafts from this source (asked once, when it enters the waiting queue)."""
        return True

    @abstractmethod
    def propose(self, req: "Req") -> None:
        """Sets req.kv.draft (tokens for the next pass to verify), or takes tokens it trusts (appends them)."""

    def learn(self, req: "Req", draft: "Draft", accepted: int, token: int) -> None:
        """The verdict on a draft: its first `accepted` tokens were kept, then the model chose `token`."""

    def ready(self, req: "Req") -> bool:
        """deferred: whether the request drafts in this step."""
        return True

    def propose_batch(self, reqs: list["Req"], limits: list[int | None]) -> None:
        """deferred: drafts for the queued requests, each of at most limits[i] tokens (None: no limit)."""
        for req in reqs:
            self.propose(req)

    def on_launch(self, batch: "ScheduleBatch", drafting: bool) -> None:
        """sees_launch: a pass was launched (before its sampler ran); `drafting`: the batch rule lets the next
        pass's requests draft."""

    def on_processed(self, batch: "ScheduleBatch") -> None:
        """sees_processed: a pass was processed (its verdicts taken, rejected KV freed)."""


@dataclass
class Draft:
    """Set by a draft source; read by the planner (rows) and by verification."""

    tokens: list[int]
    source: DraftSource
    key: object = None  # what the source made the draft from (its own, opaque to everyone else)
    # (position, token): the token in flight at that position that the draft continues, as its source guessed it;
    # a draft whose guess turns out wrong keeps none of its tokens.
    guess: tuple[int, int] | None = None
    # For a sampled request, the distribution each token was drawn from (len(tokens), vocab) on the device; None:
    # point masses (verification's rule then keeps a token with probability p(token)).
    q: "torch.Tensor | None" = None
    # A tree draft (spec/tree.py): each token's parent (-1: the request's newest token), nodes in order of depth;
    # None: a chain. Requests with a grammar get no trees (its masks are walked along chains).
    parents: list[int] | None = None

    def cut(self, n: int) -> "Draft | None":
        """The draft's first n tokens (for a tree: its first n nodes, a tree too), or None when n is 0."""
        if n >= len(self.tokens):
            return self
        if n <= 0:
            return None
        return replace(self, tokens=self.tokens[:n], q=None if self.q is None else self.q[:n],
                       parents=None if self.parents is None else self.parents[:n])
