"""Grammar jump-forward as a draft source (radixlm.runtime.grammar.jump_forward has the algorithms).

When a request's grammar forces text from here, `exact` drafts its tokens (the next pass verifies them: greedy
output is that of no jump-forward), and `fast` appends them as they are (a draft taken without verification: the
next pass computes their KV, and the output's tokenization may differ). Text forced before the first output token
becomes a draft at admission, verified by the prefill (exact only). A complete grammar whose only continuation is
the stop token ends the request without a pass for it."""
from __future__ import annotations

from collections import Counter

from radixlm.runtime.args import JumpForwardMode
from radixlm.runtime.grammar.backend import GrammarBackend
from radixlm.runtime.grammar.jump_forward import forced_tokens
from radixlm.runtime.spec.draft import Draft, DraftSource, DraftTraits
from radixlm.runtime.scheduler.req import GrammarAdvance, Req

FORCED_MEMO_ENTRIES = 4096


class JumpForwardSource(DraftSource):
    traits = DraftTraits(batch_adaptive=False)  # exact drafts of forced text: not cut by the batch rule

    def __init__(self, mode: JumpForwardMode, tokenizer, eos_token_ids: frozenset[int], backend, stats: Counter):
        """backend: returns the grammar backend (built at the first compilation)."""
        self.mode = mode
        self.tokenizer = tokenizer
        self.stop_ids = sorted(eos_token_ids)
        self._backend = backend
        self.stats = stats
        self._forced_memo: dict[tuple[int, str], tuple[list[int], bool]] = {}
        self._splits: dict[tuple[str, tuple[int, ...], int], list[int] | None] = {}  # see learn

    def applies_to(self, req: Req) -> bool:
        return self.mode is not JumpForwardMode.OFF and req.grammar is not None

    # ------------------------------------------------------------------ proposing
    def propose(self, req: Req) -> None:
        """Right after a token was accepted, or at admission before any: when the grammar forces text from here,
        draft it (exact: req.kv.draft) or take it (fast: appended to the output)."""
        grammar, mode, output = req.grammar, self.mode, req.output_ids
        if (grammar is None or mode is JumpForwardMode.OFF or req.finished_reason is not None
                or req.kv.draft is not None):
            return
        if not output:
            self._propose_first(req)
            return
        if mode is JumpForwardMode.FAST and req.return_logprob:
            return  # forced tokens have no logprobs in fast mode
        forced = grammar.jump_forward_string()
        if not forced:
            if not req.stop_checked and not req.return_logprob:
                self._take_forced_stop(req)
            return
        if mode is JumpForwardMode.EXACT:
            self._draft(req, output[-1], forced)
            return
        tokens, replaces_last = self._forced_tokens(output[-1], forced)
        tokens = tokens[: req.tokens_left() + replaces_last]
        if tokens:
            self._take_forced(req, tokens, replaces_last)

    def _propose_first(self, req: Req) -> None:
        """At admission (exact): text the grammar forces before any output token becomes a draft that the prefill
        verifies (its tokens follow the prompt as they are), so the first pass already yields the forced text and
        the token after it."""
        if self.mode is not JumpForwardMode.EXACT or req.return_logprob:
            return
        forced = req.grammar.jump_forward_string()
        if forced:
            self._draft(req, req.origin_input_ids[-1], forced)
            self.stats["first_jumps"] += req.kv.draft is not None

    def _draft(self, req: Req, last_token: int, forced: str) -> None:
        """Exact: the forced text's tokens after last_token become the request's draft (within max_new_tokens)."""
        tokens, _ = self._forced_tokens(last_token, forced)
        tokens = tokens[: req.tokens_left()]
        if tokens:
            req.kv.draft = Draft(tokens, self, (last_token, forced))
            self.stats["exact_jumps"] += 1

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
        req.append_tokens([stop], self.tokenizer)  # the grammar accepts it and terminates: the request finishes
        self.stats["stop_jumps"] += 1

    def _only_allowed(self, grammar, token: int) -> bool:
        backend: GrammarBackend = self._backend()
        bitmask = backend.allocate_bitmask(1)
        grammar.fill_bitmask(bitmask, 0)
        self.stats["masks_filled"] += 1
        # The token's bit alone: its word holds only that bit and every other word is 0 (no per-word Python loop).
        words, i = bitmask[0].tolist(), token // 32
        return i < len(words) and words[i] & 0xFFFFFFFF == 1 << (token % 32) and words.count(0) == len(words) - 1

    def _forced_tokens(self, last_token: int, forced: str) -> tuple[list[int], bool]:
        """forced_tokens, remembered: many requests of one grammar reach the same forced text after the same token.
        In exact mode a draft follows the model's last token as it is: where the canonical tokenization would merge
        across it, the forced text's own tokens are the draft. The lists returned are shared: not to be modified."""
        key = (last_token, forced)
        hit = self._forced_memo.get(key)
        if hit is None:
            tokens, replaces_last = forced_tokens(self.tokenizer, last_token, forced)
            if replaces_last and self.mode is JumpForwardMode.EXACT:
                tokens, replaces_last = self.tokenizer.encode(forced, add_special_tokens=False), False
            if len(self._forced_memo) >= FORCED_MEMO_ENTRIES:
                self._forced_memo.clear()
            hit = self._forced_memo[key] = (tokens, replaces_last)
        return hit

    def _take_forced(self, req: Req, tokens: list[int], replaces_last: bool) -> None:
        """Fast: the forced tokens become output tokens (their KV is computed by the next pass)."""
        grammar = req.grammar
        if replaces_last:
            grammar.rollback(1)
            req.output_ids.pop()
        taken = 0
        for t in tokens:
            if not grammar.accept_token(t):
                break
            taken += 1
        if replaces_last and taken == 0:
            raise AssertionError("jump-forward retokenization lost the last token")
        req.append_tokens(tokens[:taken], self.tokenizer, GrammarAdvance.DONE)
        self.stats["fast_jumps"] += 1
        self.stats["forced_tokens"] += taken
        if not req.finished() and not req.stop_checked:
            self._take_forced_stop(req)  # the forced text may have completed the grammar

    # ------------------------------------------------------------------ learning
    def learn(self, req: Req, draft: Draft, accepted: int, token: int) -> None:
        """The model split the forced text otherwise than the draft (say `{` then `"name`, not `{"`): later drafts for
        the same forced text after the same token follow its split up to where it left the draft, then the canonical
        tokens of the rest; a model token reaching past the forced text (it merged forced and free text) ends the
        draft before it. Drafts only propose: verification keeps outputs exact whatever they are."""
        if accepted >= len(draft.tokens):
            return
        last_token, forced = draft.key
        # Remembered: where the model's choice varies between requests, the drafts for one text alternate between
        # the same few splits (stats learned_drafts against distinct_lessons; json_decoding.py reports both).
        split_key = (forced, tuple(draft.tokens[:accepted]), token)
        if split_key not in self._splits:
            if len(self._splits) >= FORCED_MEMO_ENTRIES:
                self._splits.clear()
            self._splits[split_key] = self._model_split(forced, draft.tokens[:accepted], token)
            self.stats["distinct_lessons"] += 1
        learned = self._splits[split_key]
        if learned is not None:
            self._forced_memo[draft.key] = (learned, False)
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
