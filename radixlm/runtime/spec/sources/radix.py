"""The radix cache as a draft source (--speculative-algorithm RADIX): a request continues as the cached sequences
did after the same tokens -- earlier requests' prompts and outputs, other fork branches, retried agent steps. The
tree already holds them: no second store, and nothing is drafted from a namespace (extra_key: LoRA, cache salt)
other than the request's own, so drafts (and the time they save) never reveal another tenant's text.

Two lookups (cache/radix_lookup.py has their costs and how they stay valid under splits and eviction), tried in
this order:

1. The whole sequence (`path`): the request's prompt + output so far is a path in the tree up to what is cached;
   when the tree holds all of it (an earlier request asked the same and was answered; a sibling branch wrote on),
   the draft is what the tree holds after it -- the strongest evidence there is, the same context. A per-request
   PathCursor remembers the deepest node known to lie on the path, so a step compares only the tokens appended
   since the last one. The cursor is not the request's lock: the request's own tokens past its prompt are cached
   only when it finishes, so the path below its locked node is other requests' text, which may be evicted (the
   cursor notices: `deleted`) and is never pinned by a lookup.
2. The latest k tokens (`kgram`, k = --speculative-radix-match-window-size): where the tree holds the same k
   tokens in another context, the latest inserted occurrence continues them (KGramIndex). This finds an answer
   quoted in a new conversation, the same question under another system prompt. A dict lookup per step; the
   index costs memory per cached token and host time per insert and eviction, so the tree keeps it only when this
   lookup is on.

Why not only one: the index alone drafts poorly where many cached sequences share the latest k tokens (every chat
answer starts after the same template tokens: the latest cached answer wins, whatever the question), which is
where the whole-sequence walk is exact; the walk alone finds nothing once the context differs.

Both are cut to --speculative-num-draft-tokens - 1 (SGLang's count includes the verified root token) and the
tokens left (and by the batch rule, DraftPath.draft_cap).
Drafts that the model rejects outright make the request back off (spec/backoff.py), as NGRAM does. The lookups
read the tree only: no copy, no lock, no LRU timestamp, hit count or eviction-queue change."""
from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixlm.runtime.cache.radix_cache import RadixCache
from radixlm.runtime.cache.radix_lookup import PathCursor, follow, start_cursor, tokens_after
from radixlm.runtime.spec.draft import Draft, DraftSource, DraftTraits
from radixlm.runtime.spec.backoff import Backoff

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.req import Req


@dataclass
class _State:
    tokens: list[int]  # the request's prompt and output, grown with the output
    cursor: PathCursor | None = None
    backoff: Backoff = field(default_factory=Backoff)

    def update(self, req: Req) -> list[int]:
        toks, n_in, out = self.tokens, len(req.origin_input_ids), req.output_ids
        if len(toks) - n_in < len(out):
            toks.extend(out[len(toks) - n_in :])
        return toks


class RadixSource(DraftSource):
    # Its drafts shrink as the batch grows (DraftPath.draft_cap); they continue the known tokens: with a pass in
    # flight, the first guesses its token.
    traits = DraftTraits(batch_adaptive=True, guesses=True)

    def __init__(self, tree: RadixCache, max_draft: int, window: int, stats: Counter, path: bool = True,
                 kgram: bool = True):
        """max_draft: tokens drafted per step at most (ServerArgs.max_draft_tokens); path / kgram: which lookups this
        source makes (NGRAM_RADIX puts prompt lookup between them)."""
        self.tree = tree
        self.max_draft = max_draft
        self.path, self.kgram = path, kgram
        self.index = tree.enable_kgram_index(window) if kgram and not tree.disable else None
        self.stats = stats
        self._states: weakref.WeakKeyDictionary[Req, _State] = weakref.WeakKeyDictionary()

    def applies_to(self, req: Req) -> bool:
        # A grammar's request drafts too where jump-forward forces nothing (its draft is cut where the grammar refuses).
        return not self.tree.disable

    def propose(self, req: Req) -> None:
        n = min(self.max_draft + req.kv.in_flight, req.tokens_left())
        if n <= 0:
            return
        state = self._states.get(req)
        if state is None or len(state.tokens) > req.seqlen or _replaced(state.tokens, req):
            state = self._states[req] = _State(req.origin_input_ids + req.output_ids)
        if state.backoff.waiting():
            return
        tokens = state.update(req)
        draft = self._along_path(req, state, tokens, n) if self.path else None
        kind = "radix_path_drafts"
        if not draft and self.index is not None:
            hit = self.index.find(req.extra_key, tokens)
            draft = tokens_after(hit[0], hit[1], n) if hit is not None else None
            kind = "radix_kgram_drafts"
        if draft:
            req.kv.draft = Draft(draft, self)
            self.stats["radix_drafts"] += 1
            self.stats[kind] += 1

    def _along_path(self, req: Req, state: _State, tokens: list[int], n: int) -> list[int] | None:
        cur = state.cursor
        if cur is None or not cur.valid(self.tree):
            cur = state.cursor = start_cursor(self.tree)
        hit = follow(self.tree, cur, tokens, req.extra_key)
        return tokens_after(hit[0], hit[1], n) if hit is not None else None

    def learn(self, req: Req, draft: Draft, accepted: int, token: int) -> None:
        state = self._states.get(req)
        if state is not None and state.backoff.learn(accepted):
            self.stats["radix_backoffs"] += 1


def _replaced(tokens: list[int], req: Req) -> bool:
    """Whether fast jump-forward replaced the last output token `tokens` holds (its output then is rebuilt)."""
    last = len(tokens) - len(req.origin_input_ids) - 1
    return last >= 0 and req.output_ids[last] != tokens[-1]
