"""The draft path: a request's draft sources propose tokens (req.kv.draft), the planner gives the next pass a row per
draft token, and the verdict is taken here the same way whatever proposed the draft: the tokens kept, their
logprobs, the finish rules among them (Req.append_tokens), the cursor rolled back over rejected tokens (the planner
frees their KV), the source told what happened. Sources: grammar jump-forward (spec/sources/jump_forward.py),
prompt lookup (spec/sources/ngram.py), the radix cache (spec/sources/radix.py), a draft model or EAGLE head
(spec/sources/model.py). A draft may be a tree (Draft.parents: an EAGLE head with topk > 1): its rows carry a tree
mask, its verdict a path, whose KV the planner moves into place before the rest is freed (spec/tree.py); the bounds
below cut a tree's depth, the batch rule its nodes.

A source declares what it is in its DraftTraits (spec/draft.py): `deferred` sources propose for all the requests
of a processed pass at once (a draft model runs one batched pass per draft token): propose() queues the requests
they are `ready` for, and flush() -- after the pass's verdicts, once rejected KV is freed -- hands them to
propose_batch. `adaptive_length` sources draft as many tokens as each request's acceptance history suggests
(spec/adaptive.py). Sources that `sees_launch` see the rows of every pass launched (on_launch: a draft model writes
its own KV for them), those that `sees_processed` every pass processed (on_processed: an EAGLE head writes its KV
once the pass's tokens are known).

The batch rule (draft_cap): verification rows are nearly free while a decode pass is bound by reading the weights,
and cost as much as any row once the pass is bound by compute; so a decode pass of n requests may reach
--speculative-max-batch-rows (B) rows with its drafts: each request drafts at most (B - n) // n tokens (also
within --speculative-num-draft-tokens - 1: SGLang's count, the verified root token included), none once n > B/2,
so a pass has at most max(B, n) rows. It binds the sources whose drafts are guesses (batch_adaptive: NGRAM, RADIX), not grammar jump-forward, whose exact drafts are
forced text the request would take anyway. It is applied twice: when a draft is proposed (n: the running
requests; with a cap of 0 no lookup is made, and taking a request's tokens makes no draft call: may_propose)
and when the pass is planned (fit_batch: n is then the pass's own).
With drafts off for the batch, requests whose only sources follow the rule may be planned ahead by the overlap
scheduler (cursor.can_plan_ahead): large batches lose nothing to speculation being configured.

The controller (spec/controller.py, --speculative-measure-window): what a draft costs depends on the hardware
(draft model passes, verification rows, the pass after a verification not planned ahead), so the scheduler
measures what drafting buys: per batch-size bucket, output tokens per request and second of its steps with
batch_adaptive sources drafting and not, each regime explored now and then. At the start of each step (begin_step)
it decides whether they draft; where not, the step runs as under a batch-rule cap of 0 (draft_cap: no lookups, no
draft model passes, planned ahead). Exact drafts are never turned off.

The overlap scheduler: a pass is planned while the previous one is in flight, so a request's newest token is not
yet on the host when its next draft is wanted. Sources that `guesses` (NGRAM, RADIX, STANDALONE) then draft from
the tokens known so far, one token longer: the first is their guess of the token in flight (Draft.guess), which
the pass reads on the device; verification keeps the draft's tokens only where the guess was right, and takes the
model's token at the in-flight position otherwise (a guess seen wrong before launch drops the draft). The pass
after a verification is not planned ahead for its request (where its rows start is the verdict's): the
scheduler waits for it. So drafting requests alternate a pass launched ahead (drafted on a guess) and one planned
after its verdict (drafted on known tokens), and requests without a draft keep launching ahead."""
from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import torch

from radixlm.runtime.spec.tree import depths, nodes_within, path_rows
from radixlm.runtime.spec.verification import VerifyResult
from radixlm.runtime.spec.adaptive import DraftLength
from radixlm.runtime.spec.draft import DraftSource
from radixlm.runtime.spec.controller import DraftController
from radixlm.runtime.scheduler.req import GRAMMAR_VIOLATION, FinishReason, GrammarAdvance, Req

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.planner import ScheduleBatch


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class DraftPath:
    def __init__(self, sources: list[DraftSource], tokenizer, page_size: int, stats: Counter, max_batch_rows: int = 0,
                 batch_size: Callable[[], int] = lambda: 1, controller: DraftController | None = None):
        """max_batch_rows: the batch rule's B (0: no rule); batch_size: the running requests now; controller: turns
        batch_adaptive sources off for a step where drafting was measured not to pay (begin_step)."""
        self.sources = sources
        self.tokenizer = tokenizer
        self.page_size = page_size
        self.stats = stats
        self.max_batch_rows = max_batch_rows
        self.batch_size = batch_size
        self.watchers = [s for s in sources if s.traits.sees_launch]
        self.processors = [s for s in sources if s.traits.sees_processed]
        self._any_adaptive = any(s.traits.batch_adaptive for s in sources)  # a source the batch rule binds
        self._lengths: weakref.WeakKeyDictionary[Req, DraftLength] = weakref.WeakKeyDictionary()
        self._pending: list[tuple[DraftSource, Req, int | None]] = []  # deferred sources' requests, until flush
        self.controller = controller
        self.gate = True  # the controller lets batch_adaptive sources draft in this step
        self._accepted = self._drafted = 0  # draft tokens kept, and batch_adaptive ones verified, in the pass processed
        self._tokens = self._requests = self._step_drafted = 0  # this step's decode passes' tokens, requests, drafts
        self._clean = True  # no prefill pass processed in this step

    # ------------------------------------------------------------------ the controller
    def begin_step(self, n: int) -> None:
        """At the start of a scheduler step of about n requests (those running, else those waiting): the controller
        decides for it where the batch rule lets them draft."""
        ctl = self.controller
        if ctl is None:
            return
        if n and self._rule_cap(n) != 0:
            self.gate = ctl.decide(n)
        else:
            self.gate = True
            ctl.skip()
        self._tokens = self._requests = self._step_drafted = 0
        self._clean = True

    def end_step(self) -> None:
        if self.controller is not None:
            self.controller.observe(self._tokens, self._requests if self._clean else 0, self._step_drafted)

    def _tally(self, batch) -> None:
        if batch.is_prefill:
            self._clean = False
        else:
            rows = len(batch.samplers) + len(batch.verifiers)
            self._tokens += rows + self._accepted
            self._requests += rows
            self._step_drafted += self._drafted
        self._accepted = self._drafted = 0

    # ------------------------------------------------------------------ the batch rule
    def draft_cap(self, n: int) -> int | None:
        """Draft tokens a request of a decode pass of n requests may have from a batch_adaptive source (None: no
        cap)."""
        return self._rule_cap(n) if self.gate else 0

    def _rule_cap(self, n: int) -> int | None:
        rows = self.max_batch_rows
        if not rows:
            return None
        n = max(n, 1)
        return max(rows - n, 0) // n

    def drafting(self, n: int) -> bool:
        """Whether batch_adaptive sources draft for a batch of n requests."""
        return self.draft_cap(n) != 0

    def fit_batch(self, reqs: list[Req]) -> None:
        """Before a pass of `reqs` is planned: cuts their batch_adaptive drafts to the cap for this many requests."""
        if not self._any_adaptive:
            return  # (drafts come from the sources: none is cut)
        cap = self.draft_cap(len(reqs))
        if cap is None:
            return
        for req in reqs:
            draft = req.kv.draft
            if draft is not None and len(draft.tokens) > cap and draft.source.traits.batch_adaptive:
                self.stats["draft_tokens_cut"] += len(draft.tokens) - cap
                req.kv.draft = draft.cut(cap)  # a tree keeps its first (shallowest) nodes

    def attach(self, req: Req) -> None:
        """When the request enters the waiting queue (its grammar, if any, is ready)."""
        req.draft_sources = tuple(s for s in self.sources if s.applies_to(req))
        req.draft_unbounded = not all(s.traits.batch_adaptive for s in req.draft_sources)

    def may_propose(self, req: Req, drafting: bool) -> bool:
        """Whether propose(req) may do anything, `drafting` being self.drafting(the running requests): while the
        batch rule stops all of a request's sources and it holds no draft, taking its tokens makes no draft call."""
        return bool(req.draft_sources) and (drafting or req.draft_unbounded or req.kv.draft is not None)

    def after_token(self, req: Req, drafting: bool) -> None:
        """A sampled token was taken: the request's next draft, where may_propose."""
        if self.may_propose(req, drafting):
            self.propose(req)

    def propose(self, req: Req, batch: int | None = None, defer: bool = True) -> None:
        """After the request's tokens were taken (and before its first pass): the first source with something to
        propose proposes it. A draft is cut to the tokens the request may still take: its tokens are outputs once
        kept, and max_new_tokens binds them as any other (with none left, e.g. max_new_tokens=0, no draft); and
        to the batch rule's cap for `batch` requests (default: those running). Not while a pass of the request is
        in flight (planned ahead by the overlap scheduler): a draft continues the last token, not yet known.
        defer=False skips deferred sources (their drafts come at flush: too late for a pass being planned).
        With one pass in flight, only sources that guess its token draft (the module's note)."""
        kv = req.kv
        if kv.verifying:
            return
        if kv.draft is not None:
            self._check_guess(req)
        flying = kv.in_flight
        if flying > 1 or (flying and req.grammar is not None):
            return
        # (This runs for every token a grammar's request takes: the batch rule's cap is worked out only for a
        # source it binds, a deferred source's limit only when it queues the request.)
        cap: int | None = None
        for source in req.draft_sources:
            if req.finished_reason is not None or kv.draft is not None:
                break
            traits = source.traits
            if traits.batch_adaptive:
                cap = self._cap(batch)
                if cap == 0:
                    continue
            if flying and not traits.guesses:
                continue
            if traits.deferred:
                if defer and source.ready(req):
                    self._pending.append((source, req, self._limit(req, source, cap)))
                    break
                continue
            source.propose(req)
        if kv.draft is None:
            return
        self._split_guess(req)
        if kv.draft is not None:
            source = kv.draft.source
            if source.traits.batch_adaptive:
                cap = self._cap(batch)
            self._cut(req, self._limit(req, source, cap))

    def _cap(self, batch: int | None) -> int | None:
        """The batch rule's cap for `batch` requests (default: those running)."""
        return self.draft_cap(self.batch_size() if batch is None else batch)

    def _split_guess(self, req: Req) -> None:
        """A draft made with a pass in flight continues the known tokens: its first token, the guess of the token
        in flight, leaves the rows (the draft is dropped when nothing follows it)."""
        draft, kv = req.kv.draft, req.kv
        if draft is None or not kv.in_flight or draft.guess is not None:
            return
        n = kv.in_flight
        rest, q = draft.tokens[n:], draft.q[n:] if draft.q is not None else None
        kv.draft = replace(draft, tokens=rest, guess=(req.seqlen, draft.tokens[0]), q=q) if rest else None

    def _check_guess(self, req: Req) -> None:
        """Once the guessed token is on the host (the pass in flight was processed before the draft was
        launched), the draft stays only where the guess was right."""
        draft = req.kv.draft
        if draft is not None and draft.guess is not None:
            pos, token = draft.guess
            if pos < req.seqlen:
                right = req.token_at(pos) == token
                self.stats["draft_guesses_right" if right else "draft_guesses_wrong"] += 1
                req.kv.draft = replace(draft, guess=None) if right else None

    def flush(self, batch=None) -> None:
        """After pass `batch` was processed (its verdicts taken, rejected KV freed): sources with on_processed see
        it, then deferred sources propose for the requests queued since the last flush (batched per source)."""
        if batch is not None:
            if self.controller is not None:
                self._tally(batch)
            for source in self.processors:
                source.on_processed(batch)
        pending, self._pending = list({id(req): (s, req, limit) for s, req, limit in self._pending}.values()), []
        for source in dict.fromkeys(s for s, _, _ in pending):
            mine = [(req, limit) for s, req, limit in pending if s is source]
            source.propose_batch([req for req, _ in mine], [limit for _, limit in mine])
            for req, limit in mine:
                self._split_guess(req)
                if req.kv.draft is not None:
                    self._cut(req, limit)

    def on_launch(self, batch: "ScheduleBatch") -> None:
        """A pass was launched (before its sampler ran): sources that keep per-pass state see it, and whether the
        batch rule lets the next pass's batch (the running requests and those it admits) draft."""
        if not self.watchers:
            return
        drafting = self.drafting(self.batch_size() + len(batch.new_reqs))
        for source in self.watchers:
            source.on_launch(batch, drafting)

    def _limit(self, req: Req, source: DraftSource, cap: int | None) -> int | None:
        """Draft tokens `source` may propose for `req`: the batch rule's cap (for a source it binds) and the
        request's adaptive length."""
        traits = source.traits
        limit = cap if traits.batch_adaptive else None
        if traits.adaptive_length:
            limit = _min(limit, self._length(req, source).next_len())
        return limit

    def _length(self, req: Req, source: DraftSource) -> DraftLength:
        length = self._lengths.get(req)
        if length is None:
            length = self._lengths[req] = DraftLength(source.traits.max_len)
        return length

    def _cut(self, req: Req, limit: int | None) -> None:
        """To the tokens the request may still take (its draft tokens are outputs once kept, and max_new_tokens
        binds them as any other: with none left, no draft; a token in flight takes one) and to `limit`."""
        draft = req.kv.draft
        left = max(_min(req.tokens_left() - req.kv.in_flight, limit), 0)
        # A tree's accepted path is at most its depth: the bounds cut its depth.
        req.kv.draft = draft.cut(left if draft.parents is None else nodes_within(draft.parents, left))

    def propose_admitted(self, reqs: list[Req], room: int) -> None:
        """Drafts for newly admitted requests, verified by their prefill (not for a prompt cut into chunks: its logits
        come with the last chunk). Admission reserved the prompts, not the drafts: they are dropped when `room`
        (free + evictable slots) cannot hold them next to the prompts."""
        whole = [r for r in reqs if not r.is_chunked and r.draft_sources]
        batch = self.batch_size() + len(reqs)
        for req in whole:
            self.propose(req, batch, defer=False)  # a deferred draft would come after the prefill is launched
        drafted = sum(req.kv.draft_len() for req in whole)
        if drafted and room < sum(r.extend_input_len for r in reqs) + drafted + self.page_size * (2 * len(reqs) + 1):
            for req in whole:
                req.kv.draft = None

    def take_verdict(self, req: Req, verdict: VerifyResult, logprobs: torch.Tensor | None) -> int | None:
        """Appends the verdict's tokens (the kept draft tokens, then the model's own; the grammar, if any, already
        accepted them) and rolls the cursor back over rejected draft tokens. Returns the end of the positions the
        pass wrote KV for (its last draft token's), whose slots past the valid KV the planner frees
        (Planner.rejected_slots); None: nothing to free."""
        draft = req.kv.take_draft()
        self.stats["draft_tokens"] += len(draft.tokens)
        if draft.guess is not None:  # launched ahead, on a guess of the token before it
            self.stats["guessed_drafts"] += 1
            self.stats["guessed_drafts_accepted_tokens"] += verdict.accepted
        self.stats["accepted_draft_tokens"] += verdict.accepted
        self._accepted += verdict.accepted
        if draft.source.traits.batch_adaptive:
            self._drafted += len(draft.tokens)
        self.stats["draft_verifications"] += 1
        req.spec_verify_ct += 1
        req.spec_draft_tokens += len(draft.tokens)
        req.spec_accepted_tokens += verdict.accepted
        if draft.source.traits.adaptive_length:
            longest = len(draft.tokens) if draft.parents is None else max(depths(draft.parents))
            self._length(req, draft.source).update(longest, verdict.accepted)
        if verdict.accepted < len(draft.tokens) and not verdict.violated:
            draft.source.learn(req, draft, verdict.accepted, verdict.tokens[verdict.accepted])
        drafted_end = req.kv.committed  # the pass wrote KV up to the last draft token
        if verdict.path is not None and logprobs is not None:  # a tree: the rows of the accepted path
            logprobs = logprobs[path_rows(verdict.path)[: len(verdict.tokens)]]
        appended = req.append_tokens(verdict.tokens, self.tokenizer, GrammarAdvance.DONE, logprobs)
        if verdict.violated and not req.finished():
            req.finished_reason = FinishReason.aborted(GRAMMAR_VIOLATION)
        req.kv.taken(req.seqlen, appended)
        return drafted_end
