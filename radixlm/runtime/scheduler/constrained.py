"""The scheduler's side of constrained decoding: requests waiting for their grammar to compile, the batch's token
mask, advancing each request's matcher, and jump-forward (radixlm.runtime.grammar.jump_forward).

A request with a grammar lives: grammar queue (compiling) -> waiting -> prefill -> decode. A jump keeps the request
in the running batch: its forced tokens (fast) or its draft (exact) ride along in the next decode pass (several rows for
it, one for each other request), so a jump costs no forward pass of its own."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.grammar.backend import GrammarCache
from radixlm.runtime.grammar.jump_forward import (DraftVerification, VerifyResult, build_verification, draft_layout,
                                                  fill_draft_masks, forced_tokens, plain_greedy, settle)
from radixlm.runtime.grammar.on_demand import OnDemandRows, launch_on_demand, resolve
from radixlm.runtime.grammar.spec import GrammarSpec
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo
from radixlm.runtime.scheduler.req import FinishReason, Req

FORCED_MEMO_ENTRIES = 4096
GRAMMAR_VIOLATION = "no token satisfies the grammar together with the other constraints (e.g. min_new_tokens)"


@dataclass
class PassGrammar:
    """A pass's grammar work, set by prepare_pass at launch and read when its results are processed."""

    verification: DraftVerification | None = None  # drafts whose masks were filled at launch
    eager_index: dict[int, int] = field(default_factory=dict)  # id(req) -> its index in `verification`
    on_demand: OnDemandRows | None = None  # greedy rows: masks filled only where the grammar refuses the argmax
    verdicts: dict[int, VerifyResult] = field(default_factory=dict)  # id(req) -> verdict, set by resolve


class ConstrainedDecoding:
    def __init__(self, grammar_backend: str, jump_forward: str, tokenizer, vocab_size: int,
                 eos_token_ids: frozenset[int], mask_on_demand: bool = True):
        self.tokenizer = tokenizer
        self.mask_on_demand = mask_on_demand
        self.cache = GrammarCache(lambda: _make_backend(grammar_backend, tokenizer, vocab_size, eos_token_ids))
        self.jump_forward = jump_forward
        self.stop_ids = sorted(eos_token_ids)
        self.queue: list[Req] = []  # waiting for their grammar to compile
        self.stats: Counter = Counter()
        self._forced_memo: dict[tuple[int, str], tuple[list[int], bool]] = {}
        self._splits: dict[tuple[str, tuple[int, ...], int], list[int] | None] = {}  # see _learn

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
            req.finished_reason = FinishReason("abort", message=str(fut.exception()), status_code=400)
            return
        req.grammar = self.cache.backend.new_matcher(fut.result())

    def remove(self, rid: str) -> Req | None:
        for req in self.queue:
            if req.rid == rid:
                self.queue.remove(req)
                return req
        return None

    # ------------------------------------------------------------------ sampling
    def prepare_pass(self, samplers: list[Req], logits: torch.Tensor | None, info: SamplingBatchInfo | None,
                     verifiers: list[Req], verify_logits: torch.Tensor | None,
                     both: torch.Tensor | None = None) -> PassGrammar | None:
        """At launch, while the device runs the pass. Greedy rows (sampling rows and exact jump-forward drafts) keep
        their logits for `resolve` (masks on demand). The other rows' masks are filled now: the sampling rows' are
        attached to `info`, the drafts' verification is built; their costly masks (free text) in one batched call.
        both: `logits` then `verify_logits` in one tensor of the pass's own (LogitsOutput.rows), if there is one."""
        sampled = [i for i, r in enumerate(samplers) if r.grammar is not None]
        if not sampled and not verifiers:
            return None
        drafts = [r.jump_draft for r in verifiers]
        verify_rows = [list(range(o, o + len(d) + 1)) for o, d in zip(draft_layout(drafts), drafts)]
        lazy_s, eager_s = _split(sampled, [self._on_demand(samplers[i]) for i in sampled])
        lazy_v, eager_v = _split(range(len(verifiers)), [self._on_demand(r) for r in verifiers])
        pg = PassGrammar()
        if lazy_s or lazy_v:
            if both is not None and len(lazy_s) == len(samplers) and len(lazy_v) == len(verifiers):
                kept = both  # every row is on demand, and the tensor outlives the pass: no copy
            else:
                # torch.cat copies: the pass's logits buffer is reused by the next pass.
                parts = [logits if len(lazy_s) == len(samplers) else _rows(logits, lazy_s)] if lazy_s else []
                if lazy_v:
                    parts.append(verify_logits if len(lazy_v) == len(verifiers)
                                 else _rows(verify_logits, [j for k in lazy_v for j in verify_rows[k]]))
                kept = torch.cat(parts)
            pg.on_demand = launch_on_demand([samplers[i] for i in lazy_s] + [verifiers[k] for k in lazy_v],
                                            [[] for _ in lazy_s] + [drafts[k] for k in lazy_v], kept)
        if not eager_s and not eager_v:
            return pg
        backend = self.cache.backend
        reqs, eager_drafts = [verifiers[k] for k in eager_v], [drafts[k] for k in eager_v]
        layout = draft_layout(eager_drafts, first_row=len(samplers))
        bitmask = backend.allocate_bitmask(len(samplers) + sum(len(d) + 1 for d in eager_drafts))
        walked = fill_draft_masks(reqs, eager_drafts, layout, bitmask, backend,
                                  also=[(samplers[i].grammar, i) for i in eager_s])
        self.stats["masks_filled"] += sum(w + 1 for w in walked) + len(eager_s)
        if eager_s:
            info.vocab_mask, info.vocab_mask_rows = bitmask[: len(samplers)], eager_s
            info.apply_vocab_mask = backend.apply_bitmask
        if reqs:
            if len(reqs) < len(verifiers):
                verify_logits = _rows(verify_logits, [j for k in eager_v for j in verify_rows[k]])
            pg.verification = build_verification(reqs, eager_drafts, walked, layout, bitmask, verify_logits, backend)
            pg.eager_index = {id(r): k for k, r in enumerate(reqs)}
        return pg

    def _on_demand(self, req: Req) -> bool:
        return self.mask_on_demand and plain_greedy(req)

    def decides_all(self, samplers: list[Req]) -> bool:
        """Every sampling row's token will be decided by `resolve` (its grammar's mask on demand): the pass needs no
        sampler."""
        return all(r.grammar is not None and self._on_demand(r) for r in samplers)

    def resolve(self, pg: PassGrammar | None) -> None:
        """When the pass's results are processed, before its tokens are taken: decide the on-demand rows (their
        grammars are advanced over the tokens decided)."""
        if pg is not None and pg.on_demand is not None:
            pg.verdicts, filled = resolve(pg.on_demand, self.cache.backend)
            self.stats["masks_filled"] += filled

    def accept(self, req: Req, token: int) -> None:
        """After `token` was appended to req.output_ids: advance the matcher; a terminated grammar ends the
        request (its stop token was the last one allowed)."""
        if req.grammar is None or req.finished():
            return
        if not req.grammar.accept_token(token):
            req.finished_reason = FinishReason("abort", message=GRAMMAR_VIOLATION)
        elif req.grammar.is_terminated():
            req.finished_reason = FinishReason("stop", matched=token)

    def accepted(self, req: Req, token: int) -> None:
        """`token`, appended to req.output_ids, was already accepted by its grammar (a verdict): a terminated grammar
        ends the request."""
        if req.grammar is not None and not req.finished() and req.grammar.is_terminated():
            req.finished_reason = FinishReason("stop", matched=token)

    def settle(self, pg: PassGrammar, req: Req, generator: torch.Generator | None) -> VerifyResult:
        """A verifier's draft tokens kept and its next token; its grammar is advanced over them."""
        result = pg.verdicts.get(id(req))  # on demand: resolve advanced the grammar
        if result is None:
            result = settle(pg.verification, pg.eager_index[id(req)], generator)
        self.stats["draft_tokens"] += len(req.jump_draft)
        self.stats["accepted_draft_tokens"] += result.accepted
        if result.accepted < len(req.jump_draft) and not result.violated:
            self._learn(req.jump_key, req.jump_draft, result)
        req.jump_draft = []
        return result

    def _learn(self, key: tuple[int, str], draft: list[int], result: VerifyResult) -> None:
        """The model split the forced text otherwise than the draft (say `{` then `"name`, not `{"`): later drafts for
        the same forced text after the same token follow its split up to where it left the draft, then the canonical
        tokens of the rest; a model token reaching past the forced text (it merged forced and free text) ends the
        draft before it. Drafts only propose: verification keeps outputs exact whatever they are."""
        last_token, forced = key
        kept, token = result.accepted, result.tokens[result.accepted]
        # Remembered: where the model's choice varies between requests, the drafts for one text alternate between
        # the same few splits (stats learned_drafts against distinct_lessons; json_decoding.py reports both).
        split_key = (forced, tuple(draft[:kept]), token)
        if split_key not in self._splits:
            if len(self._splits) >= FORCED_MEMO_ENTRIES:
                self._splits.clear()
            self._splits[split_key] = self._model_split(forced, draft[:kept], token)
            self.stats["distinct_lessons"] += 1
        learned = self._splits[split_key]
        if learned is not None:
            self._forced_memo[key] = (learned, False)
            self.stats["learned_drafts"] += 1

    def _model_split(self, forced: str, kept: list[int], token: int) -> list[int] | None:
        """The draft for `forced` that follows the model's tokens `kept` then `token`; None when a character split
        across tokens keeps the texts from lining up."""
        decode = self.tokenizer.decode
        before = decode(kept) if kept else ""
        through = decode(kept + [token])
        if not forced.startswith(before) or not through.startswith(before):
            return None
        rest = forced[len(before):]
        piece = through[len(before):]
        if piece and rest.startswith(piece):
            tail = rest[len(piece):]
            return kept + [token] + (self.tokenizer.encode(tail, add_special_tokens=False) if tail else [])
        return kept

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
            if not req.stop_checked and not req.return_logprob:
                self._take_forced_stop(req)
            return
        if self.jump_forward == "exact":
            self._draft(req, req.output_ids[-1], forced)
            return
        tokens, replaces_last = self._forced_tokens(req.output_ids[-1], forced)
        room = req.sampling_params.max_new_tokens - len(req.output_ids) + (1 if replaces_last else 0)
        tokens = tokens[: max(room, 0)]
        if not tokens:
            return
        self._take_forced(req, tokens, replaces_last)

    def plan_first_jump(self, req: Req) -> None:
        """At admission (exact): text the grammar forces before any output token becomes a draft that the prefill
        verifies (its tokens follow the prompt as they are), so the first pass already yields the forced text and
        the token after it."""
        if (self.jump_forward != "exact" or req.grammar is None or req.output_ids or req.jump_draft
                or req.return_logprob):
            return
        forced = req.grammar.jump_forward_string()
        if forced:
            self._draft(req, req.origin_input_ids[-1], forced)
            self.stats["first_jumps"] += bool(req.jump_draft)

    def _draft(self, req: Req, last_token: int, forced: str) -> None:
        """Exact: the forced text's tokens after last_token become the request's draft (within max_new_tokens)."""
        tokens, _ = self._forced_tokens(last_token, forced)
        req.jump_draft = tokens[: max(req.sampling_params.max_new_tokens - len(req.output_ids), 0)]
        req.jump_key = (last_token, forced)
        self.stats["exact_jumps"] += bool(req.jump_draft)

    def _take_forced_stop(self, req: Req) -> None:
        """When the grammar is complete and allows one token only, a stop token: end the request with it, with no pass
        for it (its probability under the grammar is 1, so exact keeps the output of off). Looked at once per request,
        the first time the grammar accepts a stop token (a mask fill; for structured output, at its end)."""
        grammar, sp = req.grammar, req.sampling_params
        if not grammar.is_completed():
            return
        req.stop_checked = True
        if len(self.stop_ids) != 1 or len(req.output_ids) < sp.min_new_tokens:
            return  # (several stop tokens: the model chooses; under min_new_tokens the stop token is masked)
        stop = self.stop_ids[0]
        if not self._only_allowed(grammar, stop):
            return
        grammar.accept_token(stop)
        req.output_ids.append(stop)
        req.finished_reason = FinishReason("stop", matched=stop)
        self.stats["stop_jumps"] += 1

    def _only_allowed(self, grammar, token: int) -> bool:
        backend = self.cache.backend
        bitmask = backend.allocate_bitmask(1)
        grammar.fill_bitmask(bitmask, 0)
        self.stats["masks_filled"] += 1
        words = [(i, w & 0xFFFFFFFF) for i, w in enumerate(bitmask[0].tolist()) if w]
        return words == [(token // 32, 1 << (token % 32))]

    def _forced_tokens(self, last_token: int, forced: str) -> tuple[list[int], bool]:
        """forced_tokens, remembered: many requests of one grammar reach the same forced text after the same token.
        In exact mode a draft follows the model's last token as it is: where the canonical tokenization would merge
        across it, the forced text's own tokens are the draft. The lists returned are shared: not to be modified."""
        key = (last_token, forced)
        hit = self._forced_memo.get(key)
        if hit is None:
            tokens, replaces_last = forced_tokens(self.tokenizer, last_token, forced)
            if replaces_last and self.jump_forward == "exact":
                tokens, replaces_last = self.tokenizer.encode(forced, add_special_tokens=False), False
            if len(self._forced_memo) >= FORCED_MEMO_ENTRIES:
                self._forced_memo.clear()
            hit = self._forced_memo[key] = (tokens, replaces_last)
        return hit

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
        elif not req.stop_checked:
            self._take_forced_stop(req)  # the forced text may have completed the grammar

    def shutdown(self) -> None:
        self.cache.shutdown()


def _split(items, flags: list[bool]) -> tuple[list, list]:
    """(items whose flag is set, the others)."""
    yes, no = [], []
    for item, flag in zip(items, flags):
        (yes if flag else no).append(item)
    return yes, no


def _rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """A copy of some rows."""
    return logits.index_select(0, host_to_device(rows, torch.int64, logits.device))


def _make_backend(name: str, tokenizer, vocab_size: int, eos_token_ids: frozenset[int]):
    if tokenizer is None:
        raise RuntimeError("constrained decoding needs the model's tokenizer")
    if name != "xgrammar":
        raise ValueError(f"unknown grammar backend {name!r}")
    from radixlm.runtime.grammar.xgrammar_backend import XGrammarBackend

    return XGrammarBackend(tokenizer, vocab_size, sorted(eos_token_ids))
