"""Which requests the next pass carries: admission of waiting requests (PrefillAdder, the queue's policy order),
mixing the running requests' decode rows into a small prefill (any prefill with --mixed-chunk on), and keeping
the running requests' next pass within the KV pool (retraction). Admission owns none of the queues it reads and
writes (ReqQueues, shared with the Scheduler); NewTokenRatio is its estimate of the tokens running requests
still take."""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Callable

from radixlm.runtime.args import Toggle
from radixlm.runtime.cache.memory_pool import TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_cache import RadixCache
from radixlm.runtime.scheduler.config import AdmissionConfig
from radixlm.runtime.scheduler.outbox import Outbox, ReqQueues
from radixlm.runtime.scheduler.planner import Planner
from radixlm.runtime.scheduler.policy import PrefillHead, SchedulePolicy, uncached_head
from radixlm.runtime.scheduler.prefill_adder import AddReqResult, PrefillAdder, reserved_decode
from radixlm.runtime.scheduler.priority import PriorityConfig, PriorityRule
from radixlm.runtime.scheduler.req import FinishReason, FinishType, Req
from radixlm.runtime.scheduler.retract import retract, retract_decode

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.lora_adapters import LoraAdapters
    from radixlm.runtime.spec.path import DraftPath

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


class NewTokenRatio:
    """The share of their max_new_tokens that admission reserves for the running requests (SGLang's
    new_token_ratio): it starts at INIT_NEW_TOKEN_RATIO x schedule_conservativeness and decays pass by pass to a
    floor, as long as the running requests fit the pool."""

    def __init__(self, schedule_conservativeness: float):
        self.conservativeness = schedule_conservativeness
        self.init = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.min = self.init * MIN_NEW_TOKEN_RATIO_FACTOR
        self.decay_step = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init
        self.budget_use: float | None = None  # note_finished's running mean; None until a request finishes

    def note_finished(self, req: Req) -> None:
        """Learns from a request that stopped or reached its length what share of max_new_tokens requests use."""
        budget = req.sampling_params.max_new_tokens
        if req.finished_reason.type is FinishType.ABORT or not budget:
            return
        used = min(1.0, len(req.output_ids) / budget)
        prev = self.budget_use
        self.budget_use = used if prev is None else prev + BUDGET_USE_WEIGHT * (used - prev)

    def floor(self) -> float:
        """The decay's floor: the configured minimum, or the share of their budgets that requests have been using
        (scaled by schedule_conservativeness, as the ratio's start and minimum are). A workload whose requests run
        to max_new_tokens (EOS ignored, or no EOS in reach) would otherwise admit on a ratio decayed far below what
        they take, then retract and recompute them (random 1024/512 after another workload: 31 retractions, 45k of
        557k prefilled tokens recomputed, against none; benchmarks/scheduler/scheduler_sim.py --kind retraction
        budget_use=1.0)."""
        learned = (self.budget_use or 0.0) * self.conservativeness
        return max(self.min, min(learned, 1.0))

    def reset(self) -> None:
        """Idle: the next requests are admitted afresh (not on a ratio decayed or raised by an earlier wave)."""
        self.value = max(self.init, self.floor())

    def decay(self) -> None:
        self.value = max(self.value - self.decay_step, self.floor())


class Admission:
    def __init__(self, config: AdmissionConfig, queues: ReqQueues, ratio: NewTokenRatio, planner: Planner,
                 policy: SchedulePolicy, tree_cache: RadixCache, allocator: TokenToKVPoolAllocator,
                 drafts: "DraftPath", outbox: Outbox, stats: Counter, can_replay: Callable[..., bool],
                 sync_inflight: Callable[[], None], inflight_reqs: Callable[[], list[Req] | None],
                 lora: "LoraAdapters | None" = None, priority: PriorityRule | None = None):
        """can_replay: the executor's rule (ModelRunner.can_replay); sync_inflight: processes the pass in flight;
        inflight_reqs: the new requests of the pass in flight (None: no pass is); lora: under --enable-lora, the
        adapters, whose slots bound the adapters of the running and admitted requests."""
        self.config = config
        self.queues = queues
        self.ratio = ratio
        self.planner = planner
        self.policy = policy
        self.tree_cache = tree_cache
        self.allocator = allocator
        self.drafts = drafts
        self.outbox = outbox
        self.stats = stats
        self.can_replay = can_replay
        self.sync_inflight = sync_inflight
        self.inflight_reqs = inflight_reqs
        self.lora = lora
        self.priority = priority if priority is not None else PriorityRule(PriorityConfig())
        self.round_id = 0

    def admit_new(self) -> list[Req]:
        """Waiting requests admitted to the next pass (the request being prefilled in chunks first), in the
        policy's order, within the KV, prefill and chunk budgets; [] when none can be."""
        if not self.queues.waiting and self.queues.chunked is None:
            return []
        running = self.queues.running
        # Priority scheduling: a waiting request may take a running one's place (PriorityRule decides which).
        preempting = self.priority.may_preempt(self.queues.waiting, running)
        if len(running) >= self.config.max_running_requests and self.queues.chunked is None and not preempting:
            return []
        if preempting and self.inflight_reqs() is not None:
            # A preempted request is retracted, which needs its tokens on the host.
            self.sync_inflight()
            self.queues.drop_finished()
            running = self.queues.running
        self.round_id += 1
        self.policy.calc_priority(self.queues.waiting, self.round_id)
        adder = PrefillAdder(
            self.config.page_size, self.tree_cache, self.allocator, running, self.ratio.value,
            self.config.max_prefill_tokens, self.config.chunked_prefill_size,
            self.config.max_running_requests - len(running) - (self.queues.chunked is not None),
            mixed_rows=len(running) if self.config.mixed_chunk is Toggle.ON else 0,
        )
        if self.queues.chunked is not None and not adder.add_chunked_req(self.queues.chunked):
            if not running:  # nothing will free memory for it: fail it rather than spin
                req, self.queues.chunked = self.queues.chunked, None
                req.finished_reason = FinishReason.aborted("Out of memory: the prompt does not fit the KV pool")
                self.planner.release(req, insert=False)
                self.outbox.emit(req)
            return []  # decode goes on (and retracts if it must) until the next chunk fits
        # Without a radix cache nothing is shared, so nobody waits for another's prompt.
        pending, passed = (set() if self.policy.disabled_cache else self._pending_heads()), 0
        # Adapters the running requests hold slots for; a preemption below leaves its victim's in (conservative).
        adapters = None if self.lora is None else self.lora.users()
        preempted: list[Req] = []
        for req in self.queues.waiting:
            if req in self.policy.deprioritized:
                # Sorted last (within its priority); admitted next round, when the prefix they share is cached.
                if self.priority.enabled:
                    continue
                break
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
            if adapters is not None and not self.lora.slots.fits(adapters, req.lora_id):
                continue  # its adapter would need a slot that running requests' adapters hold
            if req.storage_hit and not self.tree_cache.prefetch_ready(req.match_key()):
                continue  # a hierarchical cache reads its prefix from storage; the prefetch policy waits for it
            result = adder.add_one_req(req)
            while preempting and self._preempt_for(req, result, adder, preempted):
                result = adder.add_one_req(req)
            if result != AddReqResult.CONTINUE:
                break
            if adapters is not None:
                adapters.add(req.lora_id)
            if head is not None and not self.policy.disabled_cache:
                pending.add(head)
        admitted = adder.can_run_list
        if preempted:
            self.stats["preemptions"] += len(preempted)
            logger.info("Priority preemption: %d running requests retracted for higher-priority ones", len(preempted))
        if not admitted:
            self.queues.waiting.extend(preempted)
            return []
        now = time.monotonic()
        for req in admitted:
            if req.queue_time is None:
                req.queue_time = now - req.arrived
            req.admitted_at(now)
        k = len(admitted)
        if all(a is b for a, b in zip(admitted, self.queues.waiting[:k])):
            del self.queues.waiting[:k]  # the usual case: the head of the queue (no scan of a long queue)
        else:
            taken = set(map(id, admitted))
            self.queues.waiting = [r for r in self.queues.waiting if id(r) not in taken]
        self.queues.waiting.extend(preempted)
        self.queues.chunked = adder.new_chunked_req
        self.drafts.propose_admitted(admitted, self.allocator.available_size() + self.tree_cache.evictable_size())
        return admitted

    def _preempt_for(self, req: Req, result: AddReqResult, adder: PrefillAdder, preempted: list[Req]) -> bool:
        """Retracts the running request `req` preempts next (PriorityRule.victim), when the adder refused `req` for
        want of KV or of a request slot, and gives the adder what that frees; whether one was."""
        slots_full = len(adder.can_run_list) >= adder.max_new_reqs
        if result is AddReqResult.CONTINUE or (result is AddReqResult.OTHER and not slots_full):
            return False
        if adder.can_run_list and (adder.rem_input_tokens <= 0 or adder.rem_chunk_tokens == 0):
            return False  # the pass's prefill budget is spent: retracting frees none of it
        victim = self.priority.victim(req, self.queues.running)
        if victim is None:
            return False
        pool = self.allocator.available_size() + self.tree_cache.evictable_size()
        reserved = int(max(reserved_decode(victim), 0) * self.ratio.value)
        self.queues.running.remove(victim)
        retract(victim, self.planner, time.monotonic())
        adder.rem_total_tokens += self.allocator.available_size() + self.tree_cache.evictable_size() - pool + reserved
        adder.max_new_reqs += 1
        preempted.append(victim)
        return True

    def _pending_heads(self) -> set[PrefillHead]:
        """Heads of the prompt tokens being computed that the tree does not hold yet: the chunked request's next
        chunk, and the new requests of a prefill pass in flight (the tree takes their prompts when it is processed)."""
        reqs = self.inflight_reqs() or []
        heads = [uncached_head(r, r.prefix_len) for r in reqs]
        if self.queues.chunked is not None:
            heads.append(uncached_head(self.queues.chunked, self.queues.chunked.kv.committed))
        return {h for h in heads if h is not None}

    def mixed_in(self, admitted: list[Req]) -> list[Req]:
        """The running requests whose decode rows ride along with a prefill: all of them, when the pass fits the
        pool and, unless --mixed-chunk on, the prefill is whole and the pass still runs as one CUDA-graph replay
        (the running requests do not wait a pass for the new ones); else none."""
        mix_all = self.config.mixed_chunk is Toggle.ON
        if not mix_all and (self.config.mixed_chunk is Toggle.OFF or any(r.is_chunked for r in admitted)):
            return []
        self.queues.drop_finished()
        running = self.queues.running
        if not running:
            return []
        planner = self.planner
        rows = sum(planner.row_end(r) - r.kv.committed for r in running + admitted)
        if not mix_all and not self.can_replay(rows, any(r.wants_input_logprobs() for r in admitted), multi_row=True):
            return []
        if not planner.fits(running + admitted):
            return []
        self.ratio.decay()
        self.stats["mixed_batches"] += 1
        return running

    def update_running(self) -> bool:
        """Makes the running requests' next pass fit the pool (retracting some if it must); False when none runs."""
        self.queues.drop_finished()
        if not self.queues.running:
            return False
        fits = self.planner.fits(self.queues.running)
        if not fits and self.inflight_reqs() is not None:
            # Retraction needs every request's tokens on the host; the processed pass may also free memory.
            self.sync_inflight()
            self.queues.drop_finished()
            if not self.queues.running:
                return False
            fits = self.planner.fits(self.queues.running)
        if fits:
            self.ratio.decay()
            return True
        rank = self.priority.retract_key(time.monotonic()) if self.priority.enabled else None
        retracted, self.ratio.value = retract_decode(self.queues.running, self.planner, rank)
        self.stats["retractions"] += len(retracted)
        logger.info("KV cache pool is full. Retract requests: %d, new_token_ratio %.3f", len(retracted),
                    self.ratio.value)
        self.queues.waiting = retracted + self.queues.waiting
        if self.planner.fits(self.queues.running):
            return True
        for req in self.queues.running:
            req.finished_reason = FinishReason.aborted("Out of memory even after retracting all other requests")
            self.planner.release(req, insert=False)
            self.outbox.emit(req)
        self.queues.running = []
        return False
