"""Prompt lookup as a draft source (SGLang's NGRAM, vLLM's ngram): the request's latest tokens, found earlier in its
own prompt or output, continue as they did there. Quoting, summarizing, editing code and restating earlier turns
repeat long runs of the prompt; verification keeps greedy outputs exact whatever is proposed.

Per request the source keeps its tokens and, for each run length n in [min_window, max_window], where each run of n
tokens last ended; both grow with the request, so a step costs max_window lookups, not a scan. Where the model keeps
rejecting its drafts outright (free text), the request drafts less and less often (learn); drafts from a run of
max_window tokens back off apart from those of shorter runs (benchmarks/speculative/speculative.py's edit replay at
batch 1, windows 1..4: 71 passes for 96 tokens with one back-off, 61 with two)."""
from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixlm.runtime.spec.draft import Draft, DraftSource, DraftTraits
from radixlm.runtime.spec.backoff import MAX_BACKOFF, Backoff

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.req import Req

__all__ = ["MAX_BACKOFF", "NGramSource"]


@dataclass
class _Lookup:
    """One request's tokens and the end of each run's latest occurrence (before the last position)."""

    tokens: list[int]
    indexed: int = 0  # runs ending at positions (exclusive ends) up to this one are in `ends`
    ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    # Drafts from a run of max_window tokens and from shorter runs back off apart: where shorter runs keep failing
    # (free text), a full run still drafts (a passage the output starts repeating).
    backoff: Backoff = field(default_factory=Backoff)
    full_backoff: Backoff = field(default_factory=Backoff)


class NGramSource(DraftSource):
    # Its drafts shrink as the batch grows (DraftPath.draft_cap); they continue the known tokens: with a pass in
    # flight, the first guesses its token.
    traits = DraftTraits(batch_adaptive=True, guesses=True)

    def __init__(self, max_draft: int, min_window: int, max_window: int, stats: Counter):
        """max_draft: tokens drafted per step at most (ServerArgs.max_draft_tokens: --speculative-num-draft-tokens,
        which counts the verified root token as SGLang's does, less one)."""
        self.max_draft = max_draft
        self.min_window, self.max_window = min_window, max_window
        self.stats = stats
        self._lookups: weakref.WeakKeyDictionary[Req, _Lookup] = weakref.WeakKeyDictionary()

    def applies_to(self, req: Req) -> bool:
        return True  # a grammar's request drafts too where jump-forward forces nothing (cut where it refuses)

    def propose(self, req: Req) -> None:
        k = min(self.max_draft + req.kv.in_flight, req.tokens_left())
        if k <= 0:
            return
        lk = self._lookup(req)
        waiting = lk.backoff.waiting(), lk.full_backoff.waiting()  # (both count the step)
        tokens = lk.tokens
        start, n = self._match(req)
        full = n >= self.max_window
        if start is not None and not waiting[full]:
            req.kv.draft = Draft(tokens[start : start + k], self, key=full)
            self.stats["ngram_drafts"] += 1

    def learn(self, req: Req, draft: Draft, accepted: int, token: int) -> None:
        """A draft the model rejected outright costs its verification rows for nothing: the request drafts again only
        after 1, 2, 4, ... MAX_BACKOFF steps while that repeats (a draft with any token kept resets the wait), for
        drafts of the same kind (from a run of max_window tokens, draft.key, or from a shorter one)."""
        lk = self._lookups.get(req)
        if lk is not None and (lk.full_backoff if draft.key else lk.backoff).learn(accepted):
            self.stats["ngram_backoffs"] += 1

    def _lookup(self, req: Req) -> _Lookup:
        """The request's lookup, brought up to date with its output (which grows; fast jump-forward may replace its
        last token: then it is built again)."""
        n_in, out = len(req.origin_input_ids), req.output_ids
        lk = self._lookups.get(req)
        if lk is None or len(lk.tokens) - n_in > len(out) or _replaced(lk.tokens, n_in, out):
            lk = self._lookups[req] = _Lookup(req.origin_input_ids + out)
        else:
            lk.tokens.extend(out[len(lk.tokens) - n_in :])
        return lk

    def _match(self, req: Req) -> tuple[int | None, int]:
        """Where the tokens after the latest earlier occurrence of the longest matching run start, if any."""
        lk = self._lookups[req]
        toks, ends, lo, hi = lk.tokens, lk.ends, self.min_window, self.max_window
        last = len(toks)
        # Index the runs ending before the last position (the run ending there is the one looked up).
        for end in range(max(lk.indexed, 1), last):
            for n in range(lo, min(hi, end) + 1):
                ends[tuple(toks[end - n : end])] = end
        lk.indexed = max(lk.indexed, last)
        for n in range(min(hi, last - 1), lo - 1, -1):
            end = ends.get(tuple(toks[last - n :]))
            if end is not None:
                return end, n
        return None, 0


def _replaced(tokens: list[int], n_in: int, out: list[int]) -> bool:
    """Whether the last output token `tokens` holds is no longer the output's."""
    last = len(tokens) - n_in - 1
    return last >= 0 and out[last] != tokens[-1]
