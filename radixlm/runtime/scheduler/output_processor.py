"""Turning a forward pass's results into request state: sampled tokens (and their logprobs), draft verdicts,
finishing, and the rows of the step's BatchReqOutput the front receives (through the Outbox)."""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from radixlm.runtime.executor.logits import LogitsOutput, top_logprobs
from radixlm.runtime.host_to_device import HostCopy
from radixlm.runtime.spec.verification import VerifyResult
from radixlm.runtime.scheduler.admission import NewTokenRatio
from radixlm.runtime.scheduler.outbox import Outbox, ReqQueues
from radixlm.runtime.scheduler.pass_masks import MaskPlanner, PassMasks
from radixlm.runtime.scheduler.planner import Planner, ScheduleBatch
from radixlm.runtime.scheduler.req import GRAMMAR_VIOLATION, FinishReason, GrammarAdvance, Req

if TYPE_CHECKING:
    from radixlm.runtime.spec.path import DraftPath

logger = logging.getLogger(__name__)


@dataclass
class BatchResult:
    """A launched forward pass, set by Scheduler.launch_batch and read by process_batch_result."""

    batch: ScheduleBatch
    out: LogitsOutput
    next_ids: HostCopy | None = None  # the sampled tokens (None when every sampling row is decided on demand)
    logprobs: torch.Tensor | None = None  # log_softmax of the sampling rows, when a sampler asked for logprobs
    masks: PassMasks | None = None  # the pass's grammar masks and draft verification
    done: torch.cuda.Event | None = None  # recorded after the pass where asked (PassLauncher.record_pass_done)

    def token_ids(self) -> list[int | None]:
        n = len(self.batch.samplers)
        return [None] * n if self.next_ids is None else self.next_ids.get()[0].tolist()


def _to_host(vectors: list[torch.Tensor]) -> list[list[float]]:
    """A pass's pooled vectors on the host, in one copy."""
    flat = torch.cat(vectors).tolist() if vectors else []
    out, start = [], 0
    for v in vectors:
        out.append(flat[start : start + v.shape[0]])
        start += v.shape[0]
    return out


class ResultProcessor:
    def __init__(self, queues: ReqQueues, planner: Planner, masks: MaskPlanner, drafts: "DraftPath", outbox: Outbox,
                 ratio: NewTokenRatio, stats: Counter, tokenizer, generator: torch.Generator):
        """ratio: learns from each finished request; generator: verification's draws (the sampler's)."""
        self.queues = queues
        self.planner = planner
        self.masks = masks
        self.drafts = drafts
        self.outbox = outbox
        self.ratio = ratio
        self.stats = stats
        self.tokenizer = tokenizer
        self.generator = generator
        # Called with each request that finished, before its KV is released (a prefill server publishes it).
        # Called with a request that finished and the event of the pass that finished it (None off CUDA).
        self.on_finished: Callable[[Req, torch.cuda.Event | None], None] | None = None
        self._pass_done: torch.cuda.Event | None = None  # the event of the pass being processed

    def process_batch_result(self, result: BatchResult) -> None:
        batch, out = result.batch, result.out
        self._pass_done = result.done
        self.stats["passes_processed"] += 1
        next_ids = result.token_ids()
        masks = self.masks
        masks.resolve(result.masks)
        for req in batch.samplers:
            req.kv.in_flight -= 1
        for req in batch.verifiers:
            req.kv.in_flight -= 1
        self._take_input_logprobs(result)
        out_lp = result.logprobs
        verdicts = masks.sampler_verdicts(result.masks, len(next_ids))
        is_prefill = batch.is_prefill
        drafting = self.drafts.drafting(len(self.queues.running))  # the running requests do not change while processing
        vectors = None if out.pooled is None else _to_host(out.pooled)
        for i, (req, tok) in enumerate(zip(batch.samplers, next_ids)):
            if req.finished_reason is not None:  # finished (or aborted) while this pass was in flight: no token
                continue
            try:
                if vectors is not None:
                    req.embedding = vectors[i]
                self._take_token(req, tok, verdicts[i], None if out_lp is None else out_lp[i : i + 1], drafting)
            except Exception as e:  # noqa: BLE001 - one request's data fails that request only
                self._failed(req, e)
            self._after_tokens(req, is_prefill)
        if batch.verifiers:
            self._process_verified(result)
        self.drafts.flush(batch)  # deferred sources' drafts, after the rejected KV is freed
        if batch.is_prefill:
            # The prompt becomes shareable right after its prefill (a chunk that is not the last: at launch).
            for req in batch.new_reqs:
                if not req.finished() and req is not batch.chunk:
                    self.planner.cache_chunk(req)

    @staticmethod
    def _failed(req: Req, error: Exception) -> None:
        """One request's data (logprobs, grammar, stops, drafts) failing fails that request only."""
        logger.exception("request %s failed while taking its tokens", req.rid)
        req.finished_reason = FinishReason.failed(error)

    def _take_input_logprobs(self, result: BatchResult) -> None:
        out, plan = result.out, result.batch.worker.logits
        for span in result.batch.input_spans:
            req = span.req
            if span.first_pos == 0 and req.logprob_start_len == 0:
                req.input_token_logprobs.append((None, req.origin_input_ids[0]))
                if req.top_logprobs_num:
                    req.input_top_logprobs.append(None)
            for j in range(span.start, span.end):
                req.input_token_logprobs.append((out.input_logprobs[j], plan.input_targets[j]))
                if req.top_logprobs_num:
                    req.input_top_logprobs.append(out.input_top[j][: req.top_logprobs_num])

    def _take_token(self, req: Req, tok: int | None, verdict: VerifyResult | None, lp: torch.Tensor | None,
                    drafting: bool = True) -> None:
        if req.sampling_params.max_new_tokens == 0:
            if req.top_logprobs_num and lp is not None:
                # No token, but the next token's top candidates: programs read them (SGLang reports them too).
                req.output_top_logprobs.append(top_logprobs(lp, req.top_logprobs_num)[0])
            if req.token_ids_logprob and lp is not None:
                picked = lp[0, req.token_ids_logprob].tolist()
                req.output_token_ids_logprobs.append(list(zip(picked, req.token_ids_logprob)))
            req.finished_reason = FinishReason.at_length(0)
            return
        decided = verdict.tokens[:1] if verdict is not None else None  # mask on demand: the constrained argmax
        if decided:
            appended = req.append_tokens(decided, self.tokenizer, GrammarAdvance.DONE, lp)
        elif tok is None:  # no sampler ran and nothing is allowed: the grammar is violated
            req.finished_reason = FinishReason.aborted(GRAMMAR_VIOLATION)
            return
        else:
            appended = req.append_tokens([tok], self.tokenizer, GrammarAdvance.ACCEPT, lp)
        req.kv.taken(req.seqlen, appended)
        self.drafts.after_token(req, drafting)

    def _after_tokens(self, req: Req, is_prefill: bool) -> None:
        if is_prefill:
            req.input_logprobs_done = True
        if req.finished():
            if self.on_finished is not None:
                self.on_finished(req, self._pass_done)
            self.planner.release(req)
            self.ratio.note_finished(req)
            self.stats["prompt_tokens"] += len(req.origin_input_ids)
            self.stats["cached_tokens"] += req.cached_tokens
        if req.finished() or (req.stream and self.outbox.stream_due(req)):
            self.outbox.emit(req)

    def _process_verified(self, result: BatchResult) -> None:
        """Each verifier keeps its draft's tokens while the model agrees, then its own token (DraftPath.take_verdict);
        the planner frees the KV written for rejected draft tokens, in one gather for the pass."""
        logits, row = result.out.verify_logits, 0
        rejected: list[tuple[int, int, int]] = []
        for k, req in enumerate(result.batch.verifiers):
            n_rows = req.kv.draft_len() + 1
            if req.finished_reason is not None:  # finished by the pass before (its draft was a guess): no verdict
                row += n_rows
                continue
            lps = torch.log_softmax(logits[row : row + n_rows], dim=-1) if req.return_logprob else None
            row += n_rows
            try:
                self._take_verdict(req, result.masks, k, lps, rejected, result.batch)
            except Exception as e:  # noqa: BLE001
                self._failed(req, e)
            self._after_tokens(req, result.batch.is_prefill)
        self.planner.free_rejected(rejected)

    def _take_verdict(self, req: Req, masks: PassMasks, k: int, lps: torch.Tensor | None,
                      rejected: list[tuple[int, int, int]], batch: ScheduleBatch) -> None:
        verdict = self.masks.verifier_verdict(masks, k, self.generator)
        if verdict.path is not None:
            self.stats["tree_kv_moves"] += self.planner.compact_tree(req, verdict.path)
            batch.accepted_paths[req.rid] = (req.kv.draft_len(), verdict.path)
        drafted_end = self.drafts.take_verdict(req, verdict, lps)
        span = None if drafted_end is None else self.planner.rejected_slots(req, drafted_end)
        if span is not None:
            rejected.append(span)
        self.drafts.propose(req)
