"""Turning a forward pass's results into request state: sampled tokens (and their logprobs), grammar advances,
exact jump-forward verification, finishing, and the ReqOutputs the front receives. A mixin of Scheduler, which
owns the state these methods read and write."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.host_to_device import HostCopy
from radixlm.runtime.executor.logits import LogitsOutput, LogitsPlan, top_logprobs
from radixlm.runtime.messages import ReqOutput
from radixlm.runtime.scheduler.constrained import GRAMMAR_VIOLATION, PassGrammar
from radixlm.runtime.scheduler.req import FinishReason, Req

logger = logging.getLogger(__name__)


@dataclass
class BatchResult:
    """A launched forward pass, set by Scheduler.launch_batch and read by process_batch_result. Its ScheduleBatch may
    already be preparing the next pass (overlap), so what processing needs is kept here."""

    reqs: list[Req]  # the batch's requests at launch
    prefill_reqs: list[Req]  # its new requests (all of them, or those after the running ones of a mixed batch)
    forward_mode: ForwardMode
    out: LogitsOutput
    plan: LogitsPlan
    samplers: list[Req]
    verifiers: list[Req]
    spans: list[tuple[Req, int, int, int]]
    next_ids: HostCopy | None = None  # the sampled tokens (None when every sampling row is decided on demand)
    logprobs: torch.Tensor | None = None  # log_softmax of the sampling rows, when a sampler asked for logprobs
    grammar: PassGrammar | None = None  # the grammar masks and drafts' verification of this pass

    @property
    def is_prefill(self) -> bool:
        """New requests rode in this pass (they joined the running batch at launch)."""
        return bool(self.prefill_reqs)

    def token_ids(self) -> list[int | None]:
        return [None] * len(self.samplers) if self.next_ids is None else self.next_ids.get()[0].tolist()


class SchedulerOutputProcessorMixin:
    def process_batch_result(self, result: BatchResult) -> None:
        out, plan, samplers, verifiers, spans = result.out, result.plan, result.samplers, result.verifiers, result.spans
        next_ids = result.token_ids()
        self.constrained.resolve(result.grammar)
        verdicts = result.grammar.verdicts if result.grammar is not None else {}
        for req in samplers:
            req.num_pending -= 1
        for req, start, end, prefix_len in spans:
            if prefix_len == 0 and req.logprob_start_len == 0:
                req.input_token_logprobs.append((None, req.origin_input_ids[0]))
                if req.top_logprobs_num:
                    req.input_top_logprobs.append(None)
            for j in range(start, end):
                req.input_token_logprobs.append((out.input_logprobs[j], plan.input_targets[j]))
                if req.top_logprobs_num:
                    req.input_top_logprobs.append(out.input_top[j][: req.top_logprobs_num])
        out_lp = result.logprobs
        for i, (req, tok) in enumerate(zip(samplers, next_ids)):
            if req.finished():  # finished (or aborted) while this pass was in flight: its token is dropped
                continue
            try:
                self._take_token(req, tok, verdicts.get(id(req)), None if out_lp is None else out_lp[i : i + 1])
            except Exception as e:  # noqa: BLE001 - one request's data (logprobs, grammar, stops) fails that request
                logger.exception("request %s failed while taking its token", req.rid)
                req.finished_reason = FinishReason(
                    "abort", message=f"internal error: {type(e).__name__}: {e}", status_code=500)
            self._after_tokens(req, result.is_prefill)
        if verifiers:
            self._process_verified(result)
        if result.is_prefill:
            # The prompt becomes shareable right after its prefill (chunk by chunk when chunked).
            for req in result.prefill_reqs:
                if not req.finished():
                    self.tree_cache.cache_unfinished_req(req)

    def _take_token(self, req: Req, tok: int | None, verdict, logprobs: torch.Tensor | None) -> None:
        if req.sampling_params.max_new_tokens == 0:
            if req.top_logprobs_num and logprobs is not None:
                # No token, but the next token's top candidates: programs read them (SGLang reports them too).
                req.output_top_logprobs.append(top_logprobs(logprobs, req.top_logprobs_num)[0])
            req.finished_reason = FinishReason("length", length=0)
            return
        decided = verdict is not None and bool(verdict.tokens)  # mask on demand: the constrained argmax
        if tok is None and not decided:  # no sampler ran and nothing is allowed: the grammar is violated
            req.finished_reason = FinishReason("abort", message=GRAMMAR_VIOLATION)
            return
        self._append_token(req, verdict.tokens[0] if decided else tok, logprobs, "accepted" if decided else "advance")
        self.constrained.plan_jump(req)

    def _append_token(self, req: Req, tok: int, logprobs: torch.Tensor | None, grammar: str = "advance") -> None:
        """grammar: "advance" (accept the token now), "accepted" (a verdict's only token, already accepted), or
        "ahead" (the grammar is already past the rest of a verdict: the caller checks its end)."""
        req.output_ids.append(tok)
        if req.return_logprob:
            req.output_token_logprobs.append((float(logprobs[0, tok]), tok))
            if req.top_logprobs_num:
                req.output_top_logprobs.append(top_logprobs(logprobs, req.top_logprobs_num)[0])
        if grammar == "advance":
            self.constrained.accept(req, tok)
        elif grammar == "accepted":
            self.constrained.accepted(req, tok)
        req.check_finished(self.tokenizer, self._stop_window(req))

    def _after_tokens(self, req: Req, is_prefill: bool) -> None:
        if is_prefill:
            req.input_logprobs_done = True
        if req.finished():
            self.tree_cache.cache_finished_req(req)
            self.stats["prompt_tokens"] += len(req.origin_input_ids)
            self.stats["cached_tokens"] += req.cached_tokens
        if req.finished() or (req.stream and self._stream_due(req)):
            self._emit(req)

    def _process_verified(self, result: BatchResult) -> None:
        """Exact jump-forward: keep each request's draft tokens while the model agrees, then its own token; the KV
        written for rejected draft tokens goes back to the allocator."""
        logits, row = result.out.verify_logits, 0
        rejected: list[tuple[int, int, int]] = []  # (req_to_token row, first position, end) of KV to free
        for req in result.verifiers:
            n_rows = len(req.jump_draft) + 1
            lps = torch.log_softmax(logits[row : row + n_rows], dim=-1) if req.return_logprob else None
            row += n_rows
            drafted_end = req.kv_committed_len  # the pass wrote KV up to the last draft token
            base = req.seqlen  # the last output token is at base - 1
            verdict = self.constrained.settle(result.grammar, req, self.generator)
            if lps is None:
                kept = req.extend_output(verdict.tokens, self.tokenizer, self._stop_window(req))
            else:
                kept = 0
                for j, tok in enumerate(verdict.tokens):
                    self._append_token(req, tok, lps[j : j + 1], grammar="ahead")
                    kept += 1
                    if req.finished():
                        break
            if not req.finished():
                if verdict.violated:
                    req.finished_reason = FinishReason("abort", message=GRAMMAR_VIOLATION)
                elif req.grammar.is_terminated():
                    req.finished_reason = FinishReason("stop", matched=req.output_ids[-1])
            # NOTE invariant: as after a decode step, the last output token's KV is not yet written.
            req.kv_committed_len = base + max(kept - 1, 0)
            # A page keeps its slots while it still holds a position below kv_committed_len.
            first = -(-req.kv_committed_len // self.page_size) * self.page_size
            if drafted_end > first:
                rejected.append((req.req_pool_idx, first, drafted_end))
            self.constrained.plan_jump(req)
            self._after_tokens(req, result.is_prefill)
        if rejected:
            # One gather for the batch. The rows are read before any later pass rewrites them (stream order), even
            # where a finished request's row was released above.
            pool = self.req_to_token_pool
            self.allocator.free(pool.req_to_token.view(-1).index_select(0, pool.flat_index(rejected)))

    def _stream_due(self, req: Req) -> bool:
        """The first token goes out at once (time to first token); later ones every stream_interval tokens."""
        interval = req.sampling_params.stream_interval or self.args.stream_interval
        return req.sent_len == 0 or len(req.output_ids) - req.sent_len >= interval

    def _stop_window(self, req: Req) -> int:
        stops = req.sampling_params.stop
        return 4 * max((len(s) for s in stops), default=0) + 2 if stops else 0

    def _emit(self, req: Req) -> None:
        new = req.output_ids[req.sent_len :]
        req.sent_len = len(req.output_ids)
        self.outputs.append(ReqOutput(
            rid=req.rid,
            new_output_ids=new,
            finished_reason=req.finished_reason.to_json() if req.finished_reason else None,
            prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            num_retractions=req.num_retractions,
            queue_time=req.queue_time,
            input_token_logprobs=req.input_token_logprobs,
            input_top_logprobs=req.input_top_logprobs,
            output_token_logprobs=req.output_token_logprobs,
            output_top_logprobs=req.output_top_logprobs,
        ))
        req.input_token_logprobs, req.input_top_logprobs = [], []
        req.output_token_logprobs, req.output_top_logprobs = [], []
