"""The scheduler's side of constrained decoding: requests waiting for their grammar to compile, the batch's token
mask, advancing each request's matcher, and jump-forward (radixlm.runtime.grammar.jump_forward).

A request with a grammar lives: grammar queue (compiling) -> waiting -> prefill -> decode. A jump keeps the request
in the running batch: its forced tokens (fast) or its draft (exact) ride along in the next decode pass, which then
runs in EXTEND mode (one token for the other requests), so a jump costs no forward pass of its own."""
from __future__ import annotations

from collections import Counter

import torch

from radixlm.runtime.grammar.backend import GrammarCache
from radixlm.runtime.grammar.jump_forward import (DraftVerification, VerifyResult, build_verification, draft_layout,
                                                  fill_draft_masks, forced_tokens, settle)
from radixlm.runtime.grammar.spec import GrammarSpec
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo
from radixlm.runtime.scheduler.req import FinishReason, Req

GRAMMAR_VIOLATION = "no token satisfies the grammar together with the other constraints (e.g. min_new_tokens)"


class ConstrainedDecoding:
    def __init__(self, grammar_backend: str, jump_forward: str, tokenizer, vocab_size: int,
                 eos_token_ids: frozenset[int]):
        self.tokenizer = tokenizer
        self.cache = GrammarCache(lambda: _make_backend(grammar_backend, tokenizer, vocab_size, eos_token_ids))
        self.jump_forward = jump_forward
        self.queue: list[Req] = []  # waiting for their grammar to compile
        self.stats: Counter = Counter()

    # ------------------------------------------------------------------ compilation
    def add(self, req: Req) -> bool:
        """Attach the request's grammar; True when it must wait in `queue` for the compiler."""
        spec = GrammarSpec.from_sampling_params(req.sampling_params)
        if spec is None:
            return False
        req.grammar_future = self.cache.get(spec)
        if req.grammar_future.done():
            return False
        self.queue.append(req)
        return True

    def pop_ready(self) -> list[Req]:
        """Requests whose grammar finished compiling (failed ones come back finished with an abort)."""
        ready = [r for r in self.queue if r.grammar_future.done()]
        if ready:
            self.queue = [r for r in self.queue if not r.grammar_future.done()]
        return ready

    def start(self, req: Req) -> None:
        """The grammar is compiled: give the request its own matcher (or finish it when compilation failed)."""
        fut, req.grammar_future = req.grammar_future, None
        if fut is None:
            return
        if fut.exception() is not None:
            # The API layer validates specs, so this is a spec its parser accepted but the compiler did not.
            req.finished_reason = FinishReason("abort", message=str(fut.exception()))
            return
        req.grammar = self.cache.backend.new_matcher(fut.result())

    def remove(self, rid: str) -> Req | None:
        for req in self.queue:
            if req.rid == rid:
                self.queue.remove(req)
                return req
        return None

    # ------------------------------------------------------------------ sampling
    def prepare_pass(self, samplers: list[Req], info: SamplingBatchInfo | None, verifiers: list[Req],
                     verify_logits: torch.Tensor | None) -> DraftVerification | None:
        """At launch, while the device runs the pass: the grammar masks of the sampling rows (attached to `info`)
        and the verification of the exact jump-forward drafts. The costly masks of both (free text) are filled
        in one batched call."""
        sampled = [i for i, r in enumerate(samplers) if r.grammar is not None]
        if not sampled and not verifiers:
            return None
        backend = self.cache.backend
        drafts = [r.jump_draft for r in verifiers]
        layout = draft_layout(drafts, first_row=len(samplers))
        bitmask = backend.allocate_bitmask(len(samplers) + sum(len(d) + 1 for d in drafts))
        walked = fill_draft_masks(verifiers, drafts, layout, bitmask, backend,
                                  also=[(samplers[i].grammar, i) for i in sampled])
        if sampled:
            info.vocab_mask, info.vocab_mask_rows = bitmask[: len(samplers)], sampled
            info.apply_vocab_mask = backend.apply_bitmask
        if not verifiers:
            return None
        return build_verification(verifiers, drafts, walked, layout, bitmask, verify_logits, backend)

    def accept(self, req: Req, token: int) -> None:
        """After `token` was appended to req.output_ids: advance the matcher; a terminated grammar ends the
        request (its stop token was the last one allowed)."""
        if req.grammar is None or req.finished():
            return
        if not req.grammar.accept_token(token):
            req.finished_reason = FinishReason("abort", message=GRAMMAR_VIOLATION)
        elif req.grammar.is_terminated():
            req.finished_reason = FinishReason("stop", matched=token)

    def settle(self, v: DraftVerification, i: int, generator: torch.Generator | None) -> VerifyResult:
        req = v.reqs[i]
        result = settle(v, i, generator)
        self.stats["draft_tokens"] += len(req.jump_draft)
        self.stats["accepted_draft_tokens"] += result.accepted
        req.jump_draft = []
        return result

    # ------------------------------------------------------------------ jump-forward
    def plan_jump(self, req: Req) -> None:
        """Right after a token was accepted: when the grammar forces text from here, take it (fast: append the
        retokenized tokens to the output) or draft it (exact: set req.jump_draft) for the next decode pass."""
        if self.jump_forward == "off" or req.grammar is None or req.finished() or not req.output_ids:
            return
        if self.jump_forward == "fast" and req.return_logprob:
            return  # forced tokens have no logprobs in fast mode
        forced = req.grammar.jump_forward_string()
        if not forced:
            return
        if self.jump_forward == "exact":
            # A draft follows the model's last token as it is: where the canonical tokenization would merge
            # across it, the forced text's own tokens are the draft.
            tokens, replaces_last = forced_tokens(self.tokenizer, req.output_ids[-1], forced)
            if replaces_last:
                tokens = self.tokenizer.encode(forced, add_special_tokens=False)
            req.jump_draft = tokens[: max(req.sampling_params.max_new_tokens - len(req.output_ids), 0)]
            self.stats["exact_jumps"] += bool(req.jump_draft)
            return
        tokens, replaces_last = forced_tokens(self.tokenizer, req.output_ids[-1], forced)
        room = req.sampling_params.max_new_tokens - len(req.output_ids) + (1 if replaces_last else 0)
        tokens = tokens[: max(room, 0)]
        if not tokens:
            return
        self._take_forced(req, tokens, replaces_last)

    def _take_forced(self, req: Req, tokens: list[int], replaces_last: bool) -> None:
        grammar = req.grammar
        if replaces_last:
            grammar.rollback(1)
            req.output_ids.pop()
        taken = 0
        for t in tokens:
            if not grammar.accept_token(t):
                break
            req.output_ids.append(t)
            taken += 1
        if replaces_last and taken == 0:
            raise AssertionError("jump-forward retokenization lost the last token")
        self.stats["fast_jumps"] += 1
        self.stats["forced_tokens"] += taken
        if grammar.is_terminated():
            req.finished_reason = FinishReason("stop", matched=req.output_ids[-1])
        elif len(req.output_ids) >= req.sampling_params.max_new_tokens:
            req.finished_reason = FinishReason("length", length=req.sampling_params.max_new_tokens)

    def shutdown(self) -> None:
        self.cache.shutdown()


def _make_backend(name: str, tokenizer, vocab_size: int, eos_token_ids: frozenset[int]):
    if tokenizer is None:
        raise RuntimeError("constrained decoding needs the model's tokenizer")
    if name != "xgrammar":
        raise ValueError(f"unknown grammar backend {name!r}")
    from radixlm.runtime.grammar.xgrammar_backend import XGrammarBackend

    return XGrammarBackend(tokenizer, vocab_size, sorted(eos_token_ids))
