"""Req: one generation request's state inside the scheduler.

Lifecycle: waiting -> prefill (maybe in chunks) -> decode -> finished -> its tokens inserted into the tree.
A retraction sends it back to waiting with its KV freed; it keeps its output and re-matches the tree later.
An abort or retraction at any step frees exactly what the request holds (RadixCache.cache_finished)."""
from __future__ import annotations

import enum
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from radixlm.runtime.lora.registry import cache_namespace
from radixlm.runtime.cache.radix_node import CacheLock, MatchResult, RadixKey, TreeNode
from radixlm.runtime.executor.logits import top_logprobs
from radixlm.runtime.grammar.backend import GrammarMatcher
from radixlm.runtime.messages import BootstrapInfo, TokenizedGenerateReqInput
from radixlm.runtime.multimodal.inputs import MultimodalInputs
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.sampling.thinking_budget import ThinkingTracker
from radixlm.runtime.scheduler.cursor import KVCursor
from radixlm.runtime.spec.draft import DraftSource

if TYPE_CHECKING:
    from radixlm.runtime.cache.radix_cache import RadixCache

_EMPTY = torch.empty(0, dtype=torch.int64)
GRAMMAR_VIOLATION = "no token satisfies the grammar together with the other constraints (e.g. min_new_tokens)"


class FinishType(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass
class FinishReason:
    type: FinishType
    matched: int | str | None = None  # stop: the token id or string that matched
    length: int | None = None  # length: max_new_tokens
    message: str | None = None  # abort: why
    status_code: int | None = None  # abort: the request failed (the client gets this status); None: aborted on request

    @classmethod
    def stopped(cls, matched: int | str) -> "FinishReason":
        return cls(FinishType.STOP, matched=matched)

    @classmethod
    def at_length(cls, max_new_tokens: int) -> "FinishReason":
        return cls(FinishType.LENGTH, length=max_new_tokens)

    @classmethod
    def aborted(cls, message: str, status_code: int | None = None) -> "FinishReason":
        return cls(FinishType.ABORT, message=message, status_code=status_code)

    @classmethod
    def failed(cls, error: BaseException, status_code: int = 500) -> "FinishReason":
        """An internal error while handling the request's own data."""
        return cls.aborted(f"internal error: {type(error).__name__}: {error}", status_code)

    def to_json(self) -> dict[str, Any]:
        if self.type is FinishType.STOP:
            return {"type": "stop", "matched": self.matched}
        if self.type is FinishType.LENGTH:
            return {"type": "length", "length": self.length}
        if self.status_code is not None:
            return {"type": "abort", "message": self.message, "status_code": self.status_code}
        return {"type": "abort", "message": self.message}


class GrammarAdvance(enum.Enum):
    """How append_tokens treats the request's grammar."""

    ACCEPT = "accept"  # the grammar accepts each token as it is appended
    DONE = "done"  # the grammar already accepted the tokens (a verdict chose them under it)


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
    extra_key: str | None = None  # the radix cache namespace (the request's extra_key and its adapter's id)
    stream: bool = False
    mm_inputs: MultimodalInputs | None = None  # media whose encoder outputs fill some prompt positions
    lora_id: str | None = None  # its LoRA adapter; None: the base model
    priority: int | None = None  # None: the server's --default-priority-value (read only with priority scheduling)
    timeout_s: float | None = None  # the request's own deadline, seconds after it arrived (scheduler/deadlines.py)
    embed: bool = False  # its output is pooled from the prompt's hidden states (TokenizedGenerateReqInput.embed)
    dimensions: int | None = None
    token_type_ids: list[int] | None = None
    token_ids_logprob: list[int] | None = None
    bootstrap: BootstrapInfo | None = None  # its room on a disaggregated pair (runtime/disaggregation/)
    thinking: ThinkingTracker | None = None  # its thinking budget; advanced over each appended token

    # Set by the scheduler: tokens and KV.
    output_ids: list[int] = field(default_factory=list)
    kv: KVCursor = field(default_factory=KVCursor)
    req_pool_idx: int | None = None
    cache_lock: CacheLock | None = None  # what it holds in the radix tree (set by admission and by the cache)
    finished_reason: FinishReason | None = None
    to_abort: FinishReason | None = None  # abort requested; handled at the next safe point
    # Set by the scheduler's matching (waiting requests).
    fill_ids: list[int] = field(default_factory=list)  # origin_input_ids + output_ids at (re)admission
    prefix_len: int = 0  # tokens of the matched prefix (see prefix_indices)
    _prefix: torch.Tensor | MatchResult = field(default_factory=lambda: _EMPTY, repr=False)
    last_node: TreeNode | None = None  # the node the match ends at
    match_round: int = -1  # scheduler round of the last match_prefix
    match_generation: int = -1  # the radix tree's generation at that match
    host_hit_length: int = 0  # hierarchical cache: tokens past the match held only in the host tier
    storage_hit: bool = False  # hierarchical cache: storage is reading pages past the match
    # Set by admission (PrefillAdder) for the pass it admits the request to.
    extend_input_len: int = 0  # rows admitted (the chunk size when chunked)
    is_chunked: bool = False  # mid chunked prefill: no token is sampled until the last chunk
    # Set by the scheduler: accounting.
    cached_tokens: int = 0
    started: bool = False  # its first prefill has been admitted (cached_tokens is final)
    arrived: float = field(default_factory=time.monotonic)  # when the scheduler received it
    queue_time: float | None = None  # arrival -> first admission (a retraction does not reset it)
    num_retractions: int = 0
    started_at: float | None = None  # its first admission (the running deadline counts from it)
    wait_since: float | None = None  # when it last entered the waiting queue; None while admitted
    waited: float = 0.0  # seconds in the waiting queue before wait_since (earlier stays, ended by admissions)
    # Drafts verified for it, their tokens and those kept (set by DraftPath; reported in meta_info).
    spec_verify_ct: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    input_logprobs_done: bool = False
    sent_len: int = 0  # output_ids already reported to the front
    # Constrained decoding (set by the grammar queue).
    grammar: GrammarMatcher | None = None  # advanced over every output token; None when unconstrained
    grammar_future: Future | None = None  # the compiled grammar's Future while the request waits for it
    # Draft sources that propose tokens for it (set when it enters the waiting queue).
    draft_sources: tuple[DraftSource, ...] = ()
    draft_unbounded: bool = False  # one of them is not bound by the batch rule (set with them: DraftPath.attach)
    stop_checked: bool = False  # the jump-forward source looked once whether its grammar allows only a stop token
    # Set by the scheduler for an embed request whose pooling reads every prompt row: no cached prefix is used.
    whole_prompt: bool = False
    embedding: list[float] | None = None  # the pooled output (set when its pass is processed)

    # Logprob results not yet reported (set by the scheduler, drained into the step's BatchReqOutput).
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)

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
            extra_key=cache_namespace(msg.lora_id, msg.extra_key),
            stream=msg.stream,
            mm_inputs=msg.mm_inputs,
            lora_id=msg.lora_id,
            priority=msg.priority,
            timeout_s=msg.timeout_s,
            embed=msg.embed,
            dimensions=msg.dimensions,
            token_type_ids=msg.token_type_ids,
            token_ids_logprob=msg.token_ids_logprob,
            bootstrap=msg.bootstrap,
            thinking=None if msg.thinking is None else ThinkingTracker(msg.thinking),
        )

    # ------------------------------------------------------------------ time in the queues
    def __post_init__(self) -> None:
        self.wait_since = self.arrived

    def waited_s(self, now: float) -> float:
        """Seconds spent in the waiting queue so far (all stays)."""
        return self.waited + (now - self.wait_since if self.wait_since is not None else 0.0)

    def admitted_at(self, now: float) -> None:
        if self.wait_since is not None:
            self.waited += now - self.wait_since
            self.wait_since = None
        if self.started_at is None:
            self.started_at = now

    def requeued_at(self, now: float) -> None:
        """Back in the waiting queue (retracted or preempted)."""
        self.wait_since = now

    # ------------------------------------------------------------------ matching
    @property
    def seqlen(self) -> int:
        """Tokens on the host: the prompt and the output ids."""
        return len(self.origin_input_ids) + len(self.output_ids)

    def num_output_tokens(self) -> int:
        """Output tokens so far, counting those sampled by passes still in flight."""
        return len(self.output_ids) + self.kv.in_flight

    @property
    def prefix_indices(self) -> torch.Tensor:
        """KV slots of the matched prefix (concatenated at first use: ordering the queue needs only prefix_len)."""
        if not isinstance(self._prefix, torch.Tensor):
            self._prefix = self._prefix.device_indices
        return self._prefix

    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0 and not self.input_logprobs_done

    def max_prefix_len(self) -> int:
        # NOTE: the match never covers the last token: its logits are needed to sample the next one.
        limit = len(self.fill_ids) - 1
        if self.whole_prompt:
            return 0
        if self.wants_input_logprobs():
            # The logprob of prompt token p comes from the row of token p-1, which must be computed.
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return max(limit, 0)

    def init_next_round_input(self, tree_cache: "RadixCache", round_id: int) -> None:
        self.match_round = round_id
        if (self.last_node is not None and len(self.fill_ids) == self.seqlen and tree_cache.match_unchanged(
                self.last_node, self.fill_ids, self.max_prefix_len(), self.extra_key, self.prefix_len,
                self.match_generation)):
            return  # the request did not change, and the tree holds no more or less of it than at the last match
        self._match(tree_cache, load=False)

    def rematch(self, tree_cache: "RadixCache", load: bool) -> None:
        """A fresh match (this round's may be stale); load: bring a hierarchical cache's host hit to the device."""
        self._match(tree_cache, load)

    def match_key(self) -> RadixKey:
        """The tokens a match may cover."""
        return RadixKey(self.fill_ids[: self.max_prefix_len()], self.extra_key)

    def _match(self, tree_cache: "RadixCache", load: bool) -> None:
        self.fill_ids = self.origin_input_ids + self.output_ids
        key = self.match_key()
        result = tree_cache.match_and_load(key) if load else tree_cache.match_prefix(key)
        self._prefix, self.prefix_len, self.last_node = result, result.length, result.last_node
        self.host_hit_length, self.storage_hit = result.host_hit_length, result.storage_hit
        self.extend_input_len = len(self.fill_ids) - self.prefix_len
        self.match_generation = tree_cache.generation

    def committed_key(self) -> RadixKey:
        """The tokens whose KV the request holds (req_to_token[req_pool_idx, :kv.committed])."""
        n = self.kv.committed
        n_in = len(self.origin_input_ids)
        ids = self.origin_input_ids[:n] if n <= n_in else self.origin_input_ids + self.output_ids[: n - n_in]
        return RadixKey(ids, self.extra_key)

    def token_at(self, pos: int) -> int:
        """The token at a position on the host or in the draft (not one in flight)."""
        n_in, known = len(self.origin_input_ids), self.seqlen
        if pos < n_in:
            return self.origin_input_ids[pos]
        if pos < known:
            return self.output_ids[pos - n_in]
        return self.kv.draft.tokens[pos - known - self.kv.in_flight]

    def reset_kv_state(self) -> None:
        """After its slots went back to the tree or the allocator (retraction, failure)."""
        self._prefix, self.prefix_len = _EMPTY, 0
        self.last_node = None
        self.host_hit_length, self.storage_hit = 0, False
        self.cache_lock = None
        self.req_pool_idx = None
        self.kv.reset()
        self.is_chunked = False

    # ------------------------------------------------------------------ tokens and finishing
    def finished(self) -> bool:
        return self.finished_reason is not None

    def tokens_left(self) -> int:
        """Output tokens max_new_tokens still allows."""
        return max(self.sampling_params.max_new_tokens - len(self.output_ids), 0)

    def stop_window(self) -> int:
        """Output tokens whose text can hold a stop string (each token decodes to at least one character, or an
        incomplete byte)."""
        stops = self.sampling_params.stop
        return 4 * max((len(s) for s in stops), default=0) + 2 if stops else 0

    def append_tokens(self, tokens: list[int], tokenizer, advance: GrammarAdvance = GrammarAdvance.ACCEPT,
                      logprobs: torch.Tensor | None = None) -> int:
        """Appends tokens up to the first that finishes the request; returns how many were appended. The grammar is
        advanced over each (ACCEPT) or already was (DONE), the thinking budget's tracker over those appended.
        logprobs: a row per token, when the request asked for them. Finish rules in order: grammar violation, length,
        grammar termination, then (from min_new_tokens on) stop token ids, EOS and stop strings. A finished request
        takes none (e.g. aborted while its pass ran)."""
        n = self._append_tokens(tokens, tokenizer, advance, logprobs)
        if self.thinking is not None:
            self.thinking.advance(self.output_ids)
        return n

    def _append_tokens(self, tokens: list[int], tokenizer, advance: GrammarAdvance,
                       logprobs: torch.Tensor | None) -> int:
        if self.finished_reason is not None:
            return 0
        grammar, output = self.grammar, self.output_ids
        accept = advance is GrammarAdvance.ACCEPT
        want_lp = self.return_logprob and logprobs is not None
        last = len(tokens)
        # The finish rules' inputs, read once for all the tokens (a jump appends many).
        sp = self.sampling_params
        max_new, min_new, stop_ids = sp.max_new_tokens, sp.min_new_tokens, sp.stop_token_ids
        eos = None if sp.ignore_eos else self.eos_token_ids
        strings = sp.stop if tokenizer is not None else None
        n_out = len(output)
        if last > 1 and not (accept or want_lp or strings):
            seen = set(tokens)
            if seen.isdisjoint(stop_ids or ()) and (eos is None or seen.isdisjoint(eos)):
                # (Several tokens, a jump's:) no stop token among them: only the length, then the grammar at the
                # last token, can finish the request.
                n = min(last, max(max_new - n_out, 1))
                output.extend(tokens if n == last else tokens[:n])
                if n_out + n >= max_new:
                    self.finished_reason = FinishReason.at_length(max_new)
                elif n == last and grammar is not None and grammar.is_terminated():
                    self.finished_reason = FinishReason.stopped(tokens[-1])
                return n
        for n, tok in enumerate(tokens, 1):
            output.append(tok)
            n_out += 1
            if want_lp:
                row = logprobs[n - 1 : n]
                self.output_token_logprobs.append((float(row[0, tok]), tok))
                if self.top_logprobs_num:
                    self.output_top_logprobs.append(top_logprobs(row, self.top_logprobs_num)[0])
            if accept and grammar is not None and not grammar.accept_token(tok):
                self.finished_reason = FinishReason.aborted(GRAMMAR_VIOLATION)
                return n
            # DONE: the grammar is past every token, so its state is this token's only at the last one.
            if n_out >= max_new:
                reason = FinishReason.at_length(max_new)
            elif (accept or n == last) and grammar is not None and grammar.is_terminated():
                reason = FinishReason.stopped(tok)
            elif n_out < min_new:
                continue
            elif (stop_ids and tok in stop_ids) or (eos is not None and tok in eos):
                reason = FinishReason.stopped(tok)
            elif strings:
                reason = self._stop_string(tokenizer)
                if reason is None:
                    continue
            else:
                continue
            self.finished_reason = reason
            return n
        return last

    def _stop_string(self, tokenizer) -> FinishReason | None:
        """The first stop string in the decoded tail of the output (append_tokens' last rule)."""
        tail = tokenizer.decode(self.output_ids[-(self.stop_window() + 1):], skip_special_tokens=False)
        for stop in self.sampling_params.stop:
            if stop and stop in tail:
                return FinishReason.stopped(stop)
        return None
