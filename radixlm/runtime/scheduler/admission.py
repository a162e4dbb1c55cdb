"""Which requests the next pass carries: admission of waiting requests (PrefillAdder, the queue's policy order),
mixing the running requests' decode rows into a small prefill (any prefill with --mixed-chunk on), and keeping
the running requests' next pass within the KV pool (retraction). A mixin of Scheduler, which owns the queues these
methods read and write."""
from __future__ import annotations

import logging
import time

from radixlm.runtime.args import ServerArgs, Toggle
from radixlm.runtime.scheduler.policy import PrefillHead, uncached_head
from radixlm.runtime.scheduler.prefill_adder import AddReqResult, PrefillAdder
from radixlm.runtime.scheduler.req import FinishReason, FinishType, Req
from radixlm.runtime.scheduler.retract import retract_decode

logger = logging.getLogger(__name__)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
# Weight of each finished request in the running mean of the share of max_new_tokens that requests use (the last
# ~20 requests count most).
BUDGET_USE_WEIGHT = 0.05
# Waiting requests passed over in one round because a prompt being computed covers their next tokens; past this many
# the round admits no more (bounds the scan of a long queue of siblings).
MAX_PASSED_OVER = 128


class AdmissionMixin:
    def init_admission(self, args: ServerArgs, max_running_requests: int) -> None:
        chunk = args.chunked_prefill_size
        if chunk is None:
            chunk = 8192 if self.device.startswith("cuda") else 2048
        self.chunked_prefill_size = None if chunk == -1 else chunk
        self.max_running_requests = max_running_requests
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * args.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.new_token_ratio_decay = (self.init_new_token_ratio - self.min_new_token_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio
        self.budget_use: float | None = None  # note_finished's running mean; None until a request finishes
        self.round_id = 0

    def note_finished(self, req: Req) -> None:
        """Learns from a request that stopped or reached its length what share of max_new_tokens requests use."""
        budget = req.sampling_params.max_new_tokens
        if req.finished_reason.type is FinishType.ABORT or not budget:
            return
        used = min(1.0, len(req.output_ids) / budget)
        prev = self.budget_use
        self.budget_use = used if prev is None else prev + BUDGET_USE_WEIGHT * (used - prev)

    def _ratio_floor(self) -> float:
        """The decay's floor: the configured minimum, or the share of their budgets that requests have been using
        (scaled by schedule_conservativeness, as the ratio's start and minimum are). A workload whose requests run
        to max_new_tokens (EOS ignored, or no EOS in reach) would otherwise admit on a ratio decayed far below what
        they take, then retract and recompute them (random 1024/512 after another workload: 31 retractions, 45k of
        557k prefilled tokens recomputed, against none; benchmarks/retraction_sim.py budget_use=1.0)."""
        learned = (self.budget_use or 0.0) * self.args.schedule_conservativeness
        return max(self.min_new_token_ratio, min(learned, 1.0))

    def reset_new_token_ratio(self) -> None:
        """Idle: the next requests are admitted afresh (not on a ratio decayed or raised by an earlier wave)."""
        self.new_token_ratio = max(self.init_new_token_ratio, self._ratio_floor())

    def _decay_new_token_ratio(self) -> None:
        self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self._ratio_floor())

    def admit_new(self) -> list[Req]:
        """Waiting requests admitted to the next pass (the request being prefilled in chunks first), in the
        policy's order, within the KV, prefill and chunk budgets; [] when none can be."""
        if not self.waiting_queue and self.chunked_req is None:
            return []
        running = self.running
        if len(running) >= self.max_running_requests and self.chunked_req is None:
            return []
        self.round_id += 1
        self.policy.calc_priority(self.waiting_queue, self.round_id)
        adder = PrefillAdder(
            self.page_size, self.tree_cache, self.allocator, running, self.new_token_ratio,
            self.args.max_prefill_tokens, self.chunked_prefill_size,
            self.max_running_requests - len(running) - (self.chunked_req is not None),
            mixed_rows=len(running) if self.args.mixed_chunk is Toggle.ON else 0,
        )
        if self.chunked_req is not None and not adder.add_chunked_req(self.chunked_req):
            if not running:  # nothing will free memory for it: fail it rather than spin
                req, self.chunked_req = self.chunked_req, None
                req.finished_reason = FinishReason.aborted("Out of memory: the prompt does not fit the KV pool")
                self.planner.release(req, insert=False)
                self._emit(req)
            return []  # decode goes on (and retracts if it must) until the next chunk fits
        # Without a radix cache nothing is shared, so nobody waits for another's prompt.
        pending, passed = (set() if self.policy.disabled_cache else self._pending_heads()), 0
        for req in self.waiting_queue:
            if req in self.policy.deprioritized:
                break  # sorted last; admitted next round, when the prefix they share is cached
            if req.match_round != self.round_id:
                req.init_next_round_input(self.tree_cache, self.round_id)
            head = uncached_head(req, req.prefix_len)
            if head is not None and head in pending:
                # A request admitted this round, or in the prefill pass in flight, computes these tokens; the tree
                # holds them once that pass is processed, and this one waits (in place) to match them.
                passed += 1
                if passed > MAX_PASSED_OVER:
                    break
                continue
            if adder.add_one_req(req) != AddReqResult.CONTINUE:
                break
            if head is not None and not self.policy.disabled_cache:
                pending.add(head)
        admitted = adder.can_run_list
        if not admitted:
            return []
        now = time.monotonic()
        for req in admitted:
            if req.queue_time is None:
                req.queue_time = now - req.arrived
        k = len(admitted)
        if all(a is b for a, b in zip(admitted, self.waiting_queue[:k])):
            del self.waiting_queue[:k]  # the usual case: the head of the queue (no scan of a long queue)
        else:
            taken = set(map(id, admitted))
            self.waiting_queue = [r for r in self.waiting_queue if id(r) not in taken]
        self.chunked_req = adder.new_chunked_req
        self.drafts.propose_admitted(admitted, self.allocator.available_size() + self.tree_cache.evictable_size())
        return admitted

    def _pending_heads(self) -> set[PrefillHead]:
        """Heads of the prompt tokens being computed that the tree does not hold yet: the chunked request's next
        chunk, and the new requests of a prefill pass in flight (the tree takes their prompts when it is processed)."""
        reqs = self.inflight.batch.new_reqs if self.inflight is not None else []
        heads = [uncached_head(r, r.prefix_len) for r in reqs]
        if self.chunked_req is not None:
            heads.append(uncached_head(self.chunked_req, self.chunked_req.kv.committed))
        return {h for h in heads if h is not None}

    def _mixed_in(self, admitted: list[Req]) -> list[Req]:
        """The running requests whose decode rows ride along with a prefill: all of them, when the pass fits the
        pool and, unless --mixed-chunk on, the prefill is whole and the pass still runs as one CUDA-graph replay
        (the running requests do not wait a pass for the new ones); else none."""
        mix_all = self.args.mixed_chunk is Toggle.ON
        if not mix_all and (self.args.mixed_chunk is Toggle.OFF or any(r.is_chunked for r in admitted)):
            return []
        self._drop_finished()
        running = self.running
        if not running:
            return []
        planner = self.planner
        rows = sum(planner.row_end(r) - r.kv.committed for r in running + admitted)
        if not mix_all and not self.runner.can_replay(rows, any(r.wants_input_logprobs() for r in admitted),
                                                      multi_row=True):
            return []
        if not planner.fits(running + admitted):
            return []
        self._decay_new_token_ratio()
        self.stats["mixed_batches"] += 1
        return running

    def update_running(self) -> bool:
        """Makes the running requests' next pass fit the pool (retracting some if it must); False when none runs."""
        self._drop_finished()
        if not self.running:
            return False
        fits = self.planner.fits(self.running)
        if not fits and self.inflight is not None:
            # Retraction needs every request's tokens on the host; the processed pass may also free memory.
            self.sync_inflight()
            self._drop_finished()
            if not self.running:
                return False
            fits = self.planner.fits(self.running)
        if fits:
            self._decay_new_token_ratio()
            return True
        retracted, self.new_token_ratio = retract_decode(self.running, self.planner)
        self.stats["retractions"] += len(retracted)
        logger.info("KV cache pool is full. Retract requests: %d, new_token_ratio %.3f", len(retracted),
                    self.new_token_ratio)
        self.waiting_queue = retracted + self.waiting_queue
        if self.planner.fits(self.running):
            return True
        for req in self.running:
            req.finished_reason = FinishReason.aborted("Out of memory even after retracting all other requests")
            self.planner.release(req, insert=False)
            self._emit(req)
        self.running = []
        return False
