"""Req: one generation request's state inside the scheduler.

Lifecycle: waiting -> prefill (maybe in chunks) -> decode -> finished -> its tokens inserted into the tree.
A retraction sends it back to waiting with its KV freed; it keeps its output and re-matches the tree later.
An abort or retraction at any step frees exactly what the request holds (cache_finished_req)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampling_params import SamplingParams

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclass
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None  # stop: the token id or string that matched
    length: int | None = None  # length: max_new_tokens
    message: str | None = None  # abort: why
    status_code: int | None = None  # abort: the request failed (the client gets this status); None: aborted on request

    def to_json(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        if self.status_code is not None:
            return {"type": "abort", "message": self.message, "status_code": self.status_code}
        return {"type": "abort", "message": self.message}


@dataclass(eq=False)
class Req:
    # Set by the caller (from TokenizedGenerateReqInput).
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    extra_key: str | None = None
    stream: bool = False

    # Set by the scheduler.
    output_ids: list[int] = field(default_factory=list)
    fill_ids: list[int] = field(default_factory=list)  # origin_input_ids + output_ids at (re)admission
    prefix_len: int = 0  # tokens of the matched prefix (see prefix_indices)
    _prefix: Any = field(default_factory=lambda: _EMPTY, repr=False)  # a tensor, or a MatchResult not yet concatenated
    last_node: Any = None  # locked radix node at the end of the prefix
    cache_protected_len: int = 0  # slots [0, cache_protected_len) belong to the tree
    req_pool_idx: int | None = None
    kv_committed_len: int = 0  # tokens of fill_ids whose KV is written
    extend_input_len: int = 0  # new tokens in the current extend (the chunk size when chunked)
    is_chunked: bool = False  # mid chunked prefill: no token is sampled until the last chunk
    match_round: int = -1  # scheduler round of the last match_prefix
    match_generation: int = -1  # the radix tree's generation at that match
    finished_reason: FinishReason | None = None
    cached_tokens: int = 0
    started: bool = False  # its first prefill has been admitted (cached_tokens is final)
    arrived: float = field(default_factory=time.monotonic)  # when the scheduler received it
    queue_time: float | None = None  # arrival -> first admission (a retraction does not reset it)
    num_retractions: int = 0
    input_logprobs_done: bool = False
    sent_len: int = 0  # output_ids already reported to the front
    to_abort: str | None = None  # abort requested (message); handled at the next safe point
    # Constrained decoding (set by the scheduler).
    grammar: Any = None  # GrammarMatcher, advanced over every output token; None when unconstrained
    grammar_future: Any = None  # the compiled grammar's Future while the request waits for it
    jump_draft: list[int] = field(default_factory=list)  # exact jump-forward: forced tokens the next pass verifies
    jump_key: Any = None  # (token before it, forced text): what the draft was made for
    stop_checked: bool = False  # jump-forward looked once whether its grammar allows nothing but a stop token
    # Overlap scheduling: tokens sampled by launched passes whose ids the host has not read yet (0 or 1).
    num_pending: int = 0

    # Logprob results not yet reported (set by the scheduler, drained into ReqOutput).
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)

    @classmethod
    def from_input(cls, msg: TokenizedGenerateReqInput, eos_token_ids: frozenset[int]) -> "Req":
        return cls(
            rid=msg.rid,
            origin_input_ids=list(msg.input_ids),
            sampling_params=msg.sampling_params,
            eos_token_ids=eos_token_ids,
            return_logprob=msg.return_logprob,
            logprob_start_len=msg.logprob_start_len,
            top_logprobs_num=msg.top_logprobs_num,
            extra_key=msg.extra_key,
            stream=msg.stream,
        )

    # ------------------------------------------------------------------ matching
    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def prefix_indices(self) -> torch.Tensor:
        """KV slots of the matched prefix (concatenated at first use: ordering the queue needs only prefix_len)."""
        if not isinstance(self._prefix, torch.Tensor):
            self._prefix = self._prefix.device_indices
        return self._prefix

    @prefix_indices.setter
    def prefix_indices(self, value: torch.Tensor) -> None:
        self._prefix, self.prefix_len = value, len(value)

    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0 and not self.input_logprobs_done

    def max_prefix_len(self) -> int:
        # NOTE: the match never covers the last token: its logits are needed to sample the next one.
        limit = len(self.fill_ids) - 1
        if self.wants_input_logprobs():
            # The logprob of prompt token p comes from the row of token p-1, which must be computed.
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return max(limit, 0)

    def init_next_round_input(self, tree_cache, round_id: int) -> None:
        from radixlm.runtime.cache.radix_cache import RadixKey

        self.match_round = round_id
        if (self.last_node is not None and len(self.fill_ids) == self.seqlen and tree_cache.match_unchanged(
                self.last_node, self.fill_ids, self.max_prefix_len(), self.extra_key, self.prefix_len,
                self.match_generation)):
            return  # the request did not change, and the tree holds no more or less of it than at the last match
        self.fill_ids = self.origin_input_ids + self.output_ids
        key = RadixKey(self.fill_ids[: self.max_prefix_len()], self.extra_key)
        result = tree_cache.match_prefix(key)
        self._prefix, self.prefix_len, self.last_node = result, result.length, result.last_node
        self.extend_input_len = len(self.fill_ids) - self.prefix_len
        self.match_generation = tree_cache.generation

    def decode_end(self) -> int:
        """End (exclusive) of the positions the next decode pass writes: the last output token (or the one still in
        flight), plus the forced tokens a fast jump appended (also output tokens without KV) or an exact jump's draft."""
        return self.seqlen + self.num_pending + len(self.jump_draft)

    def reset_kv_state(self) -> None:
        """After its slots went back to the tree or the allocator (retraction)."""
        self.prefix_indices = _EMPTY
        self.last_node = None
        self.cache_protected_len = 0
        self.req_pool_idx = None
        self.kv_committed_len = 0
        self.is_chunked = False

    # ------------------------------------------------------------------ finishing
    def finished(self) -> bool:
        return self.finished_reason is not None

    def extend_output(self, tokens: list[int], tokenizer, stop_str_max_len: int) -> int:
        """Appends tokens, with check_finished after each one, up to the first that finishes the request; returns how
        many were appended."""
        for n, tok in enumerate(tokens, 1):
            self.output_ids.append(tok)
            self.check_finished(tokenizer, stop_str_max_len)
            if self.finished():
                return n
        return len(tokens)

    def check_finished(self, tokenizer, stop_str_max_len: int) -> None:
        """Order: length -> EOS / stop_token_ids -> stop strings on the decoded tail."""
        if self.finished():
            return
        sp = self.sampling_params
        if len(self.output_ids) >= sp.max_new_tokens:
            self.finished_reason = FinishReason("length", length=sp.max_new_tokens)
            return
        last = self.output_ids[-1]
        if len(self.output_ids) < sp.min_new_tokens:
            return
        if sp.stop_token_ids and last in sp.stop_token_ids:
            self.finished_reason = FinishReason("stop", matched=last)
            return
        if not sp.ignore_eos and last in self.eos_token_ids:
            self.finished_reason = FinishReason("stop", matched=last)
            return
        if sp.stop and tokenizer is not None:
            # Each token decodes to at least one character (or an incomplete byte), so this tail suffices.
            tail = tokenizer.decode(self.output_ids[-(stop_str_max_len + 1):], skip_special_tokens=False)
            for stop in sp.stop:
                if stop and stop in tail:
                    self.finished_reason = FinishReason("stop", matched=stop)
                    return
