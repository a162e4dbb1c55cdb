"""Scheduler: continuous batching over one ModelRunner with a radix cache (paper Algorithm 1).

One `step()` = take new requests and aborts -> pick the requests of the next pass (newly admitted ones have
priority, with the running ones' decode rows mixed in when that costs nothing; otherwise the running ones,
retracting when KV runs out) -> the Planner makes its rows -> launch forward + sampling -> process results.
It speaks TokenizedGenerateReqInput / AbortReq in and one BatchReqOutput per step out, so the serving layer can run it
in its own process unchanged.

Overlap (the default on CUDA): a step launches pass N+1 before it processes the results of pass N, so the host
prepares and post-processes while the device computes; when that is allowed is cursor.can_launch_ahead."""
from __future__ import annotations

import logging
from collections import Counter
from typing import Callable

import torch

from radixlm.runtime.args import GrammarMaskMode, ServerArgs
from radixlm.runtime.grammar.backend import GrammarCache
from radixlm.runtime.messages import BatchReqOutput, TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.scheduler.aborts import Aborts
from radixlm.runtime.scheduler.admission import Admission, NewTokenRatio
from radixlm.runtime.scheduler.config import AdmissionConfig, OutputConfig
from radixlm.runtime.scheduler.cursor import can_launch_ahead
from radixlm.runtime.scheduler.disagg import Disaggregation
from radixlm.runtime.scheduler.deadlines import DeadlineConfig, Deadlines, Expired
from radixlm.runtime.scheduler.grammar_queue import GrammarQueue, grammar_backend
from radixlm.runtime.scheduler.integrity import check_kv_accounting
from radixlm.runtime.scheduler.outbox import Outbox, ReqQueues
from radixlm.runtime.scheduler.output_processor import BatchResult, ResultProcessor
from radixlm.runtime.scheduler.pass_masks import MaskPlanner
from radixlm.runtime.scheduler.launcher import PassLauncher
from radixlm.runtime.scheduler.planner import Planner, ScheduleBatch
from radixlm.runtime.scheduler.policy import SchedulePolicy
from radixlm.runtime.scheduler.priority import PRIORITY_DISABLED_MESSAGE, PriorityConfig, PriorityRule
from radixlm.runtime.scheduler.req import FinishReason, Req
from radixlm.runtime.scheduler.shared_prefix import min_prefix_len
from radixlm.runtime.scheduler.tree_cache import build_tree_cache
from radixlm.runtime.spec.factory import DraftContext, DraftFactory
from radixlm.runtime.spec.path import DraftPath
from radixlm.runtime.scheduler.lora_adapters import LoraAdapters

logger = logging.getLogger(__name__)

STAT_KEYS = ("prefill_batches", "decode_batches", "prefill_tokens", "retractions", "cached_tokens", "prompt_tokens",
             "flushes", "jump_decode_batches", "jump_row_batches", "prefill_row_batches", "mixed_batches",
             "overlapped_batches", "passes_launched", "passes_processed", "preemptions", "deadline_aborts")


class Scheduler:
    def __init__(self, server_args: ServerArgs, model_runner, tokenizer, eos_token_ids: frozenset[int],
                 drafts: DraftFactory):
        self.args = server_args
        self.runner = model_runner
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.device = model_runner.device
        self.page_size = server_args.page_size
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.allocator = model_runner.token_to_kv_pool_allocator
        self.tree_cache = build_tree_cache(server_args, model_runner)
        media = getattr(model_runner, "mm_embedder", None) is not None
        # Multimodal positions run eagerly whatever the batch (ModelRunner._run): groups in every decode pass there.
        self.planner = Planner(self.req_to_token_pool, self.allocator, self.tree_cache, self.page_size,
                               min_prefix_len(model_runner.takes_shared_prefixes), media=media,
                               replays=(lambda rows: False) if media else model_runner.can_replay,
                               kv_pool=model_runner.token_to_kv_pool)
        seed = server_args.random_seed if server_args.random_seed is not None else 0
        # Constrained decoding and drafts: one counter for their stats (masks filled, jumps, drafts kept, ...).
        self.grammar_stats: Counter = Counter()
        vocab_size = model_runner.model_config.vocab_size
        grammars = GrammarCache(lambda: grammar_backend(server_args.grammar_backend, tokenizer, vocab_size,
                                                        eos_token_ids))
        parallel = model_runner.parallel
        self.grammar_queue = GrammarQueue(grammars, parallel.all_true if parallel.tp_size > 1 else None)
        self.masks = MaskPlanner(lambda: grammars.backend, server_args.grammar_mask is GrammarMaskMode.ON_DEMAND,
                                 self.grammar_stats)
        self.queues = ReqQueues()
        self.outbox = Outbox(OutputConfig.from_args(server_args))
        self._drafts = drafts.build(DraftContext(self.tree_cache, tokenizer, eos_token_ids, lambda: grammars.backend,
                                                self.grammar_stats, self.page_size, lambda: len(self.queues.running)))
        self.priority = PriorityRule(PriorityConfig.from_args(server_args))
        self.deadlines = Deadlines(DeadlineConfig.from_args(server_args), checks=parallel.tp_rank == 0)
        self.policy = SchedulePolicy(server_args.schedule_policy, self.tree_cache, self.tree_cache.disable, seed,
                                     self.priority)
        self.generator = torch.Generator(device=self.device)
        # Tensor-parallel ranks sample alike from the same logits only with the same generator: rank 0's seed.
        self.generator.manual_seed(parallel.broadcast_object(
            seed if server_args.random_seed is not None else torch.seed()))
        self.stats: Counter = Counter({k: 0 for k in STAT_KEYS})  # for tests, benchmarks and metrics
        admission = AdmissionConfig.from_args(server_args, self.device, model_runner.max_running_requests)
        self.ratio = NewTokenRatio(admission.schedule_conservativeness)
        # LoRA: the adapters' device slots (the runner swaps them in), loads and unloads.
        self.lora = LoraAdapters(server_args, model_runner.lora, self._reqs) if server_args.enable_lora else None
        self.admission = Admission(admission, self.queues, self.ratio, self.planner, self.policy, self.tree_cache,
                                   self.allocator, self._drafts, self.outbox, self.stats, model_runner.can_replay,
                                   self.sync_inflight, self._inflight_reqs, self.lora, self.priority)
        self.results = ResultProcessor(self.queues, self.planner, self.masks, self._drafts, self.outbox, self.ratio,
                                       self.stats, tokenizer, self.generator)
        self.overlap = server_args.overlap_schedule.resolve(model_runner.is_cuda)
        self.launcher = PassLauncher(model_runner, self.planner, self.masks, self._drafts, self.stats, self.generator,
                                     self.overlap)
        self.inflight: BatchResult | None = None
        self.launching: ScheduleBatch | None = None  # the pass step() planned last (set by step)
        # Set by the owner of the loop: where outputs go while the device runs a pass just launched (else step
        # returns them). Delivering them there takes detokenizing and sending off the critical path.
        self.output_sink: Callable[[BatchReqOutput], None] | None = None
        # Reported by /server_info; set by weight updates (their weight_version, else their count).
        self.weight_version = "default"
        # Prefill/decode disaggregation: the side this server plays, if any (scheduler/disagg.py).
        self.disagg = Disaggregation.attach(self)
        self.pd_prefill, self.pd_decode = self.disagg.prefill, self.disagg.decode
        self.aborts = Aborts(self.queues, self.grammar_queue, self.disagg, self.planner, self.outbox, self.deadlines,
                             self.stats, self.sync_inflight)

    # ------------------------------------------------------------------ the parts' state, as the scheduler's
    @property
    def drafts(self) -> DraftPath:
        """The scheduler's one handle on drafting, shared with admission, launching and result processing."""
        return self._drafts

    @drafts.setter
    def drafts(self, path: DraftPath) -> None:
        self._drafts = self.admission.drafts = self.results.drafts = self.launcher.drafts = path

    @property
    def sampler(self) -> Sampler:
        return self.launcher.sampler

    @sampler.setter
    def sampler(self, sampler: Sampler) -> None:
        self.launcher.sampler = sampler

    @property
    def waiting_queue(self) -> list[Req]:
        return self.queues.waiting

    @waiting_queue.setter
    def waiting_queue(self, reqs: list[Req]) -> None:
        self.queues.waiting = reqs

    @property
    def running(self) -> list[Req]:
        return self.queues.running

    @running.setter
    def running(self, reqs: list[Req]) -> None:
        self.queues.running = reqs

    @property
    def chunked_req(self) -> Req | None:
        return self.queues.chunked

    @chunked_req.setter
    def chunked_req(self, req: Req | None) -> None:
        self.queues.chunked = req

    @property
    def outputs(self) -> BatchReqOutput:
        return self.outbox.outputs

    def _inflight_reqs(self) -> list[Req] | None:
        return None if self.inflight is None else self.inflight.batch.new_reqs

    # ------------------------------------------------------------------ input
    def add_request(self, msg: TokenizedGenerateReqInput) -> None:
        if msg.priority is not None and not self.priority.enabled and self.priority.config.abort_when_disabled:
            self.outputs.add(msg.rid, [], FinishReason.aborted(PRIORITY_DISABLED_MESSAGE, 503).to_json(),
                             len(msg.input_ids), 0, 0)
            return
        try:
            if msg.lora_id is not None and self.lora is None:
                raise ValueError("LoRA serving is off")
            if self.lora is not None:
                self.lora.check_request(msg.lora_id)
            req = Req.from_input(msg, self.eos_token_ids)
            self.disagg.arrive(req)
            self.deadlines.track(req)
            pooler = self.runner.pooler
            if req.embed != (pooler is not None):
                raise ValueError("an embedding request needs --is-embedding, and a server with it takes nothing else")
            req.whole_prompt = req.embed and pooler.needs_whole_prompt
            if not self.grammar_queue.add(req):  # else it waits for its grammar to compile
                self._enter_waiting(req)
        except Exception as e:  # noqa: BLE001 - one request's data must not stop the scheduler
            logger.exception("request %s failed on arrival", msg.rid)
            self.outputs.add(msg.rid, [], FinishReason.failed(e).to_json(), len(msg.input_ids), 0, 0)

    def refuse(self, msg: TokenizedGenerateReqInput, message: str, status_code: int) -> None:
        """Answers a request without running it: aborted with status_code."""
        self.outputs.add(msg.rid, [], FinishReason.aborted(message, status_code).to_json(), len(msg.input_ids), 0, 0)

    def _enter_waiting(self, req: Req) -> None:
        self.grammar_queue.start(req)
        if req.finished():
            self.outbox.emit(req)
        else:
            self.drafts.attach(req)
            if not self.disagg.takes(req):
                self.waiting_queue.append(req)

    # ------------------------------------------------------------------ aborts (aborts.py)
    def abort_request(self, rid: str, message: str = "aborted by the client") -> None:
        self.abort_requests([rid], message)

    def abort_requests(self, rids: list[str], message: str = "aborted by the client") -> None:
        """One pass over the queues however many rids (a client leaving a batch of thousands aborts them all)."""
        reason = FinishReason.aborted(message)
        self.aborts.abort({rid: reason for rid in rids})

    def expired(self, now: float) -> list[Expired]:
        """The requests past a deadline at `now` (deadlines.py); [] at once when none can expire."""
        return self.aborts.expired(now)

    def abort_expired(self, expired: list[Expired]) -> None:
        self.aborts.abort_expired(expired)

    def abort_all(self, message: str) -> int:
        """Aborts every request the scheduler holds (queued, compiling its grammar, running); returns how many."""
        rids = [r.rid for r in self.aborts.held()]
        self.abort_requests(rids, message)
        return len(rids)

    def _active_reqs(self) -> list[Req]:
        return self.aborts.active()

    def disagg_holding(self) -> list[Req]:
        """Requests waiting for their KV from a prefill server that hold KV slots already (the accounting check)."""
        return self.disagg.holding()

    def close_disaggregation(self) -> None:
        self.disagg.close()

    def flush_cache(self) -> bool:
        # Requests that finished in the last step leave the running batch at the next one: drop them now, so a
        # flush right after the last response succeeds.
        self.sync_inflight()
        self.queues.drop_finished()
        if not self.is_idle():
            return False
        self.tree_cache.reset()
        self.stats["flushes"] += 1
        self.req_to_token_pool.clear()
        self.allocator.clear()
        self.check_memory()
        return True

    def is_idle(self) -> bool:
        return (self.nothing_to_run() and not self.grammar_queue.queue and not self.outputs
                and not self.disagg.pending() and not self.disagg.draining())

    def nothing_to_run(self) -> bool:
        """No pass can be formed now (requests whose grammar compiles may still be pending)."""
        return not self.waiting_queue and not self.running and self.chunked_req is None and self.inflight is None

    def stats_snapshot(self) -> dict:
        embedder = getattr(self.runner, "mm_embedder", None)
        return {**self.stats, **self.grammar_stats, **(embedder.stats() if embedder is not None else {}),
                **self.tree_cache.tier_stats()}

    # ------------------------------------------------------------------ the loop
    def progress(self) -> int:
        """Grows with every pass launched or processed: what the watchdog counts as the scheduler working."""
        return self.stats["passes_launched"] + self.stats["passes_processed"]

    def step(self) -> BatchReqOutput:
        self.aborts.process()
        # Whether guessing sources draft in this step (the controller, if any); with none running, those admitted
        # draft for their prefill.
        self.drafts.begin_step(len(self.running) or len(self.waiting_queue))
        out = self._step()
        self.drafts.end_step()
        return out

    def _step(self) -> BatchReqOutput:
        self.disagg.step()  # a decode server's requests whose KV arrived join the running batch
        for req in self.grammar_queue.pop_ready():
            self._enter_waiting(req)
        if self.inflight is not None and not (self.overlap and can_launch_ahead(
                self.running, self.drafts.drafting(len(self.running)))):
            self.sync_inflight()
        batch = self.get_next_batch_to_run()
        self.launching = batch
        previous, self.inflight = self.inflight, None
        if batch is not None:
            self.inflight = self.launch_batch(batch)
            # New requests decode from the next step on (their first token may be in flight).
            self.running.extend(r for r in batch.new_reqs if not r.is_chunked and not r.finished())
            self.launching = None
            if self.output_sink is not None and self.outputs:
                self.output_sink(self.outbox.take())
        if previous is not None:
            self.stats["overlapped_batches"] += batch is not None
            self.results.process_batch_result(previous)  # while the device runs the pass just launched
        if not self.overlap:
            self.sync_inflight()
        if self.args.enable_integrity_check or self.is_idle():
            self.check_memory()
        if self.output_sink is not None and batch is not None and self.inflight is None:
            # The device is idle (the pass was processed in this step): the sink gets them once the next pass is
            # launched, or the next step returns them. (With a pass in flight, returning them now overlaps it.)
            return BatchReqOutput()
        return self.outbox.take()

    def sync_inflight(self) -> None:
        """Process the pass in flight, if any (its results are then on the host)."""
        if self.inflight is not None:
            result, self.inflight = self.inflight, None
            self.results.process_batch_result(result)

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        admitted = self.admission.admit_new()
        if admitted:
            batch = self._plan(self.admission.mixed_in(admitted), admitted)
            self.stats["prefill_batches"] += 1
            self.stats["prefill_tokens"] += sum(batch.worker.extend_lens[len(batch.reqs) - len(admitted):])
            return batch
        if not self.admission.update_running():
            # Idle: the next requests are admitted afresh. A ratio decayed (or raised) by an earlier wave would
            # over-commit the pool and retract, as SGLang's idle check also resets it
            # (benchmarks/scheduler/scheduler_sim.py --kind retraction).
            self.ratio.reset()
            return None
        batch = self._plan(self.running, [])
        self.stats["decode_batches"] += 1
        self.stats["jump_decode_batches"] += batch.num_rows > len(batch.reqs)  # draft or forced tokens rode along
        return batch

    def _plan(self, running: list[Req], admitted: list[Req]) -> ScheduleBatch:
        self.drafts.fit_batch(running + admitted if admitted else running)
        batch = self.planner.plan(running, admitted, self.launcher.next_token_buf)
        if self.lora is not None:
            self.lora.plan(batch)
        return batch

    def _reqs(self, queued: bool = False) -> list[Req]:
        """The running requests, the chunked one and the pass in flight's; with queued, the waiting ones and those
        whose grammar compiles too."""
        reqs = list(self.running) + (self._inflight_reqs() or [])
        if self.chunked_req is not None:
            reqs.append(self.chunked_req)
        return reqs + self.waiting_queue + self.grammar_queue.queue if queued else reqs

    # ------------------------------------------------------------------ forward
    def launch_batch(self, batch: ScheduleBatch) -> BatchResult:
        """Enqueue the forward pass and sampling (launcher.py); nothing here waits for the device."""
        return self.launcher.launch(batch)

    # ------------------------------------------------------------------ integrity
    def check_memory(self) -> None:
        check_kv_accounting(self)
