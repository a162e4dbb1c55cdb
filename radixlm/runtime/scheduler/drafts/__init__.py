"""The draft path: a request's draft sources propose tokens (req.kv.draft), the planner gives the next pass a row per
draft token, and the verdict is taken here the same way whatever proposed the draft: the tokens kept, their
logprobs, the finish rules among them (Req.append_tokens), the cursor rolled back over rejected tokens and their KV
freed, the source told what happened. Grammar jump-forward (drafts/jump_forward.py) is the source today; an n-gram,
radix-cache or draft-model source plugs in as another DraftSource given to DraftPath."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Protocol

import torch

from radixlm.runtime.sampling.verification import VerifyResult
from radixlm.runtime.scheduler.req import GRAMMAR_VIOLATION, FinishReason, GrammarAdvance, Req


class Proposer(Protocol):
    """A draft source as DraftPath drives it (also cursor.DraftSource: learn)."""

    def applies_to(self, req: Req) -> bool: ...

    def propose(self, req: Req) -> None:
        """Sets req.kv.draft (tokens for the next pass to verify), or takes tokens it trusts (appends them)."""


class DraftPath:
    def __init__(self, sources: list[Proposer], tokenizer, page_size: int, stats: Counter):
        self.sources = sources
        self.tokenizer = tokenizer
        self.page_size = page_size
        self.stats = stats

    def attach(self, req: Req) -> None:
        """When the request enters the waiting queue (its grammar, if any, is ready)."""
        req.draft_sources = tuple(s for s in self.sources if s.applies_to(req))

    def propose(self, req: Req) -> None:
        """After the request's tokens were taken (and before its first pass): the first source with something to
        propose proposes it. A draft is cut to the tokens the request may still take: its tokens are outputs once
        kept, and max_new_tokens binds them as any other (with none left, e.g. max_new_tokens=0, no draft)."""
        for source in req.draft_sources:
            if req.finished() or req.kv.draft is not None:
                break
            source.propose(req)
        draft = req.kv.draft
        if draft is not None and len(draft.tokens) > req.tokens_left():
            left = req.tokens_left()
            req.kv.draft = replace(draft, tokens=draft.tokens[:left]) if left else None

    def propose_admitted(self, reqs: list[Req], room: int) -> None:
        """Drafts for newly admitted requests, verified by their prefill (not for a prompt cut into chunks: its logits
        come with the last chunk). Admission reserved the prompts, not the drafts: they are dropped when `room`
        (free + evictable slots) cannot hold them next to the prompts."""
        whole = [r for r in reqs if not r.is_chunked and r.draft_sources]
        for req in whole:
            self.propose(req)
        drafted = sum(req.kv.draft_len() for req in whole)
        if drafted and room < sum(r.extend_input_len for r in reqs) + drafted + self.page_size * (2 * len(reqs) + 1):
            for req in whole:
                req.kv.draft = None

    def take_verdict(self, req: Req, verdict: VerifyResult, logprobs: torch.Tensor | None) -> tuple[int, int, int] | None:
        """Appends the verdict's tokens (the kept draft tokens, then the model's own; the grammar, if any, already
        accepted them) and rolls the cursor back over rejected draft tokens. Returns the (req_to_token row, first
        position, end) of the KV slots to free, if any: the pages past the last valid position that the pass
        wrote."""
        draft, req.kv.draft = req.kv.draft, None
        self.stats["draft_tokens"] += len(draft.tokens)
        self.stats["accepted_draft_tokens"] += verdict.accepted
        req.spec_verify_ct += 1
        req.spec_draft_tokens += len(draft.tokens)
        req.spec_accepted_tokens += verdict.accepted
        if verdict.accepted < len(draft.tokens) and not verdict.violated:
            draft.source.learn(req, draft, verdict.accepted, verdict.tokens[verdict.accepted])
        drafted_end = req.kv.committed  # the pass wrote KV up to the last draft token
        appended = req.append_tokens(verdict.tokens, self.tokenizer, GrammarAdvance.DONE, logprobs)
        if verdict.violated and not req.finished():
            req.finished_reason = FinishReason.aborted(GRAMMAR_VIOLATION)
        req.kv.taken(req.seqlen, appended)
        # A page keeps its slots while it still holds a position below kv.committed.
        first = -(-req.kv.committed // self.page_size) * self.page_size
        return (req.req_pool_idx, first, drafted_end) if drafted_end > first else None
