"""KVCursor: where one request's KV stands against its tokens (vLLM v1's `num_computed_tokens`, with the overlap
scheduler's tokens in flight and drafts).

A request's positions, in order:
    [0, known)                         tokens on the host: the prompt, then the output ids
    [known, known + in_flight)         tokens sampled by launched passes that the host has not read yet
    [.., end)                          the draft's tokens, proposed by a draft source, verified by the next pass
A draft proposed while a pass of the request is in flight continues the tokens known so far: its source's first
token is a guess of the token in flight (Draft.guess), kept out of the rows (the pass reads the real one on the
device) and checked when the draft is verified.
KV is written (or being written by a launched pass) for positions [0, committed). Every pass computes positions
[committed, end) of each of its requests -- or a prefix of them, a chunk -- and, when it reaches `end`, yields
logits at its last 1 + len(draft) rows: the token after the last known one, then the token after each draft token.
Prefill, chunked prefill, decode, a decode carrying jump-forward tokens and draft verification are this one rule.
A draft model (STANDALONE) holds its own KV of positions [0, draft_kv_len) <= committed: it lags while the draft
model's passes are skipped, and catches up before the request drafts (spec/sources/model.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from radixlm.runtime.spec.draft import Draft

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.req import Req


@dataclass(slots=True)
class KVCursor:
    committed: int = 0  # set by the planner at launch (to the end of the rows launched) and lowered after tokens
    in_flight: int = 0  # set by the planner at launch (+1 per sampled row), lowered when the pass is processed
    draft: Draft | None = None  # set by a draft source; taken by verification
    verifying: bool = False  # the draft is in a launched pass (its verdict decides `committed`)
    draft_kv_len: int = 0  # set by the draft model's source and the planner; lowered with `committed`

    def end(self, known: int) -> int:
        """End (exclusive) of the positions the next pass may compute."""
        return known + self.in_flight + (len(self.draft.tokens) if self.draft is not None else 0)

    def draft_len(self) -> int:
        return len(self.draft.tokens) if self.draft is not None else 0

    def launched(self, end: int, samples: bool) -> None:
        """A pass computing positions up to `end` was launched; `samples`: it yields this request's next token."""
        self.committed = end
        self.in_flight += samples
        self.verifying = samples and self.draft is not None

    def take_draft(self) -> Draft:
        """The verified draft, off the cursor (its verdict is being taken)."""
        draft, self.draft, self.verifying = self.draft, None, False
        return draft

    def taken(self, known: int, appended: int) -> None:
        """The host appended `appended` tokens of a processed pass (it now knows `known`). KV is valid only for
        positions whose tokens are final and were rows of a launched pass: not the newest token, if this pass chose
        it, nor the rejected tokens of a draft. (A draft being verified keeps its rows until its verdict.)"""
        valid = known + self.in_flight - (1 if appended else 0)
        if self.verifying:
            valid += len(self.draft.tokens)
        if valid < self.committed:
            self.committed = valid
        if self.draft_kv_len > self.committed:
            self.draft_kv_len = self.committed

    def reset(self) -> None:
        """Its KV went back to the tree or the allocator (retraction, failure)."""
        self.committed, self.in_flight, self.draft, self.verifying, self.draft_kv_len = 0, 0, None, False, 0


def can_plan_ahead(req: "Req", drafting: bool = True) -> bool:
    """NOTE invariant (the overlap rule): a request's next pass may be planned while its last pass is in flight --
    before the host has read that pass's token -- only when the next pass needs nothing from the host but lengths:
    no grammar (its mask follows the accepted tokens), no draft being verified (its verdict decides where the next
    rows start), no penalty counted over the output tokens, no thinking budget whose forced token at the next
    position depends on the token in flight (ThinkingTracker.decided), and no source that would draft once the token
    in flight is known but cannot draft before (`drafting`: the batch rule lets guessing sources draft,
    DraftPath.drafting; sources that `guesses` draft from the known tokens, the token in flight guessed, Draft.guess).
    Everything else the planner needs (committed, in_flight, a draft not yet launched) is known at launch."""
    sp = req.sampling_params
    return (req.grammar is None and not req.kv.verifying
            and not (drafting and any(not s.traits.guesses for s in req.draft_sources))
            and sp.repetition_penalty == 1.0 and sp.frequency_penalty == 0.0 and sp.presence_penalty == 0.0
            and (req.thinking is None or req.thinking.decided(req.output_ids, req.num_output_tokens())))


def can_launch_ahead(running: Iterable["Req"], drafting: bool = True) -> bool:
    """The next pass may be launched before the pass in flight is processed when every running request can be
    planned ahead. (A prompt's chunk in flight needs nothing from the host: the scheduler caches it at launch.)"""
    return all(can_plan_ahead(r, drafting) for r in running)
