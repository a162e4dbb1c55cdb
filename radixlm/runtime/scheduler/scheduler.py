"""Scheduler: continuous batching over one ModelRunner with a radix cache (paper Algorithm 1).

One `step()` = take new requests and aborts -> pick the next batch (a new prefill batch has priority;
otherwise decode the running batch, retracting when KV runs out) -> launch forward + sample -> process results.
It speaks TokenizedGenerateReqInput / AbortReq in and ReqOutput out, so the serving layer can run it
in its own process unchanged.

Overlap (the default on CUDA): a step launches batch N+1 before it processes the results of batch N, so the host
prepares and post-processes while the device computes. All KV bookkeeping happens at launch; a request whose
token from N is still on the device counts it in `num_pending`, and N+1 reads that token from `next_token_buf`.
A request that finishes at N has already been launched in N+1: that token is dropped. A prefill batch's requests join
the running batch at launch. Batches whose next step needs host-side results (grammars, jump-forward, penalties
over output tokens, the next chunk of a chunked prefill, retraction, aborts) process the in-flight batch first."""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.cache.radix_cache import RadixCache
from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.host_to_device import HostCopy, host_to_device
from radixlm.runtime.executor.logits import LogitsOutput, LogitsPlan
from radixlm.runtime.messages import ReqOutput, TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo
from radixlm.runtime.scheduler.batch import ScheduleBatch
from radixlm.runtime.scheduler.constrained import ConstrainedDecoding
from radixlm.runtime.scheduler.output_processor import BatchResult, SchedulerOutputProcessorMixin
from radixlm.runtime.scheduler.policy import SchedulePolicy
from radixlm.runtime.scheduler.prefill_adder import AddReqResult, PrefillAdder
from radixlm.runtime.scheduler.req import FinishReason, Req

logger = logging.getLogger(__name__)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


class Scheduler(SchedulerOutputProcessorMixin):
    def __init__(self, server_args: ServerArgs, model_runner, tokenizer, eos_token_ids: frozenset[int]):
        self.args = server_args
        self.runner = model_runner
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.device = model_runner.device
        self.page_size = server_args.page_size
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.allocator = model_runner.token_to_kv_pool_allocator
        self.tree_cache = RadixCache(
            self.req_to_token_pool, self.allocator, page_size=self.page_size,
            disable=server_args.disable_radix_cache, eviction_policy=server_args.radix_eviction_policy,
        )
        seed = server_args.random_seed if server_args.random_seed is not None else 0
        self.constrained = ConstrainedDecoding(
            server_args.grammar_backend, server_args.jump_forward, tokenizer, model_runner.model_config.vocab_size,
            eos_token_ids, mask_on_demand=server_args.grammar_mask == "on_demand",
        )
        self.policy = SchedulePolicy(server_args.schedule_policy, self.tree_cache, server_args.disable_radix_cache, seed)
        self.sampler = Sampler()
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed if server_args.random_seed is not None else torch.seed())

        chunk = server_args.chunked_prefill_size
        if chunk is None:
            chunk = 8192 if self.device.startswith("cuda") else 2048
        self.chunked_prefill_size = None if chunk == -1 else chunk
        self.max_running_requests = model_runner.max_running_requests

        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * server_args.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.new_token_ratio_decay = (self.init_new_token_ratio - self.min_new_token_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio

        self.overlap = server_args.enable_overlap_schedule or (
            model_runner.is_cuda and not server_args.disable_overlap_schedule)
        self.inflight: BatchResult | None = None
        # Overlap: the last token sampled for each req_to_token row, read by the next decode pass on the device.
        self.next_token_buf = torch.zeros(self.req_to_token_pool.size, dtype=torch.int64, device=self.device)

        self.waiting_queue: list[Req] = []
        self.running_batch = self._new_batch([], ForwardMode.DECODE)
        self.chunked_req: Req | None = None
        self.launching: ScheduleBatch | None = None  # the batch step() picked last (set by step)
        self.round_id = 0
        self.outputs: list[ReqOutput] = []
        # Set by the owner of the loop: where outputs go while the device runs a pass just launched (else step
        # returns them). Delivering them there takes detokenizing and sending off the critical path.
        self.output_sink: Callable[[list[ReqOutput]], None] | None = None
        # Counters for tests, benchmarks and (later) metrics.
        self.stats = {"prefill_batches": 0, "decode_batches": 0, "prefill_tokens": 0, "retractions": 0, "cached_tokens": 0,
                      "prompt_tokens": 0, "flushes": 0, "jump_decode_batches": 0, "jump_row_batches": 0,
                      "prefill_row_batches": 0, "mixed_batches": 0, "overlapped_batches": 0}

    def _new_batch(self, reqs: list[Req], mode: ForwardMode) -> ScheduleBatch:
        return ScheduleBatch(reqs, mode, self.req_to_token_pool, self.allocator, self.tree_cache, self.page_size, self.device)

    # ------------------------------------------------------------------ input
    def add_request(self, msg: TokenizedGenerateReqInput) -> None:
        try:
            req = Req.from_input(msg, self.eos_token_ids)
            if not self.constrained.add(req):  # else it waits for its grammar to compile
                self._enter_waiting(req)
        except Exception as e:  # noqa: BLE001 - one request's data must not stop the scheduler
            logger.exception("request %s failed on arrival", msg.rid)
            self.outputs.append(ReqOutput(msg.rid, [], FinishReason(
                "abort", message=f"internal error: {type(e).__name__}: {e}", status_code=500).to_json(),
                prompt_tokens=len(msg.input_ids), completion_tokens=0, cached_tokens=0))

    def _enter_waiting(self, req: Req) -> None:
        self.constrained.start(req)
        if req.finished():
            self._emit(req)
        else:
            self.waiting_queue.append(req)

    def abort_request(self, rid: str, message: str = "aborted by the client") -> None:
        self.abort_requests([rid], message)

    def abort_requests(self, rids: list[str], message: str = "aborted by the client") -> None:
        """One pass over the queues however many rids (a client leaving a batch of thousands aborts them all)."""
        wanted = set(rids)
        queued = [r for r in self.constrained.queue if r.rid in wanted]
        self.constrained.queue = [r for r in self.constrained.queue if r.rid not in wanted]
        kept = []
        for req in self.waiting_queue:
            (queued if req.rid in wanted and req.req_pool_idx is None else kept).append(req)
        self.waiting_queue = kept
        for req in queued:
            req.finished_reason = FinishReason("abort", message=message)
            self._emit(req)
        for req in self._active_reqs():
            if req.rid in wanted:
                req.to_abort = message

    def _active_reqs(self) -> list[Req]:
        reqs = [r for r in self.running_batch.reqs if not r.finished()]
        if self.chunked_req is not None and not self.chunked_req.finished():
            reqs.append(self.chunked_req)
        return reqs

    def _process_aborts(self) -> None:
        if self.inflight is not None and any(r.to_abort is not None for r in self._active_reqs()):
            self.sync_inflight()
        for req in self._active_reqs():
            if req.to_abort is not None and not req.finished():
                req.finished_reason = FinishReason("abort", message=req.to_abort)
                self.tree_cache.cache_finished_req(req)
                if req is self.chunked_req:
                    self.chunked_req = None
                self._emit(req)
        self.running_batch.filter_batch()

    def flush_cache(self) -> bool:
        # Requests that finished in the last step leave the running batch at the next one: drop them now, so a
        # flush right after the last response succeeds.
        self.sync_inflight()
        self.running_batch.filter_batch()
        if not self.is_idle():
            return False
        self.tree_cache.reset()
        self.stats["flushes"] += 1
        self.req_to_token_pool.clear()
        self.allocator.clear()
        self.check_memory()
        return True

    def is_idle(self) -> bool:
        return self.nothing_to_run() and not self.constrained.queue and not self.outputs

    def nothing_to_run(self) -> bool:
        """No batch can be formed now (requests whose grammar compiles may still be pending)."""
        return (not self.waiting_queue and self.running_batch.is_empty() and self.chunked_req is None
                and self.inflight is None)

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[ReqOutput]:
        self._process_aborts()
        for req in self.constrained.pop_ready():
            self._enter_waiting(req)
        if self.inflight is not None and not self._can_launch_ahead():
            self.sync_inflight()
        batch = self.get_next_batch_to_run()
        self.launching = batch
        previous, self.inflight = self.inflight, None
        if batch is not None:
            self.inflight = self.launch_batch(batch)
            # New requests decode from the next step on (their first token may be pending).
            self.running_batch.merge_batch([r for r in self.inflight.prefill_reqs if not r.is_chunked and not r.finished()])
            self.launching = None
            if self.output_sink is not None and self.outputs:
                out, self.outputs = self.outputs, []
                self.output_sink(out)
        if previous is not None:
            self.stats["overlapped_batches"] += batch is not None
            self.process_batch_result(previous)  # while the device runs the batch just launched
        if not self.overlap:
            self.sync_inflight()
        if self.args.enable_integrity_check or self.is_idle():
            self.check_memory()
        if self.output_sink is not None and batch is not None and self.inflight is None:
            # The device is idle (the pass was processed in this step): the sink gets them once the next pass is
            # launched, or the next step returns them. (With a pass in flight, returning them now overlaps it.)
            return []
        out, self.outputs = self.outputs, []
        return out

    def sync_inflight(self) -> None:
        """Process the batch in flight, if any (its results are then on the host)."""
        if self.inflight is not None:
            result, self.inflight = self.inflight, None
            self.process_batch_result(result)

    def _can_launch_ahead(self) -> bool:
        """Whether the next batch can be prepared before the one in flight is processed: not when that batch carries
        jump-forward tokens, nor a prefill chunk whose next chunk needs it cached, nor while a running request needs
        its last token on the host."""
        r = self.inflight
        if not self.overlap or (not r.forward_mode.is_decode() and not r.is_prefill):
            return False
        if r.is_prefill and any(q.is_chunked for q in r.reqs):
            return False
        return all(_overlap_safe(q) for q in self.running_batch.reqs)

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        batch = self.get_new_batch_prefill()
        if batch is not None:
            self._mix_in_running(batch)
            return batch
        self.update_running_batch()
        return None if self.running_batch.is_empty() else self.running_batch

    def _mix_in_running(self, batch: ScheduleBatch) -> None:
        """A small prefill (a DECODE-mode batch, one CUDA-graph row per token) takes the running requests' decode
        rows along when all fit in the largest graph and their KV fits without retracting: the running requests do
        not wait a pass for the new ones."""
        running = self.running_batch
        if self.args.disable_mixed_prefill or not batch.forward_mode.is_decode() or any(r.is_chunked for r in batch.reqs):
            return
        running.filter_batch()
        rows = len(batch.input_ids) + sum(r.decode_end() - r.kv_committed_len for r in running.reqs)
        if running.is_empty() or rows > self.runner.graph_runner.max_bs or not running.check_decode_mem():
            return
        self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)
        running.prepare_for_decode(self.runner.graph_runner.max_bs)
        batch.mix_in_decode(running)
        self.stats["mixed_batches"] += 1

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        if not self.waiting_queue and self.chunked_req is None:
            return None
        running = self.running_batch.reqs
        if len(running) >= self.max_running_requests and self.chunked_req is None:
            return None
        self.round_id += 1
        self.policy.calc_priority(self.waiting_queue, self.round_id)
        adder = PrefillAdder(
            self.page_size, self.tree_cache, self.allocator, running, self.new_token_ratio,
            self.args.max_prefill_tokens, self.chunked_prefill_size,
            self.max_running_requests - len(running) - (self.chunked_req is not None),
        )
        if self.chunked_req is not None and not adder.add_chunked_req(self.chunked_req):
            if not running:  # nothing will free memory for it: fail it rather than spin
                req, self.chunked_req = self.chunked_req, None
                req.finished_reason = FinishReason("abort", message="Out of memory: the prompt does not fit the KV pool")
                self.tree_cache.cache_finished_req(req, is_insert=False)
                self._emit(req)
            return None  # decode goes on (and retracts if it must) until the next chunk fits
        for req in self.waiting_queue:
            if req in self.policy.deprioritized:
                break  # sorted last; admitted next round, when the prefix they share is cached
            if req.match_round != self.round_id:
                req.init_next_round_input(self.tree_cache, self.round_id)
            if adder.add_one_req(req) != AddReqResult.CONTINUE:
                break
        if not adder.can_run_list:
            return None
        now = time.monotonic()
        for req in adder.can_run_list:
            if req.queue_time is None:
                req.queue_time = now - req.arrived
        k = len(adder.can_run_list)
        if all(a is b for a, b in zip(adder.can_run_list, self.waiting_queue[:k])):
            del self.waiting_queue[:k]  # the usual case: the head of the queue (no scan of a long queue)
        else:
            admitted = set(map(id, adder.can_run_list))
            self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        self.chunked_req = adder.new_chunked_req
        self._plan_first_jumps(adder.can_run_list)
        batch = self._new_batch(adder.can_run_list, ForwardMode.EXTEND)
        graphs = self.runner.graph_runner
        batch.prepare_for_extend(graphs.max_bs if graphs is not None else 0)
        self.stats["prefill_batches"] += 1
        self.stats["prefill_row_batches"] += batch.forward_mode.is_decode()
        self.stats["prefill_tokens"] += sum(batch.extend_lens)
        return batch

    def _plan_first_jumps(self, reqs: list[Req]) -> None:
        """Exact jump-forward drafts for new requests whose grammar forces their first tokens, verified by the prefill
        (not for a prompt cut into chunks: its logits come with the last chunk). The drafts are dropped when the pool
        cannot hold them next to the prompts (admission reserved the prompts, not the drafts, for a request alone)."""
        whole = [r for r in reqs if not r.is_chunked]
        for req in whole:
            self.constrained.plan_first_jump(req)
        drafted = sum(len(r.jump_draft) for r in whole)
        if drafted:
            need = sum(r.extend_input_len for r in reqs) + drafted + self.page_size * (2 * len(reqs) + 1)
            if self.allocator.available_size() + self.tree_cache.evictable_size() < need:
                for req in whole:
                    req.jump_draft = []

    def update_running_batch(self) -> None:
        batch = self.running_batch
        batch.filter_batch()
        if batch.is_empty():
            return
        fits = batch.check_decode_mem()
        if not fits and self.inflight is not None:
            # Retraction needs every request's tokens on the host; the processed batch may also free memory.
            self.sync_inflight()
            batch.filter_batch()
            if batch.is_empty():
                return
            fits = batch.check_decode_mem()
        if fits:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)
        else:
            retracted, self.new_token_ratio = batch.retract_decode()
            self.stats["retractions"] += len(retracted)
            logger.info("KV cache pool is full. Retract requests: %d, new_token_ratio %.3f", len(retracted), self.new_token_ratio)
            self.waiting_queue = retracted + self.waiting_queue
            if not batch.check_decode_mem():
                for req in batch.reqs:
                    req.finished_reason = FinishReason("abort", message="Out of memory even after retracting all other requests")
                    self.tree_cache.cache_finished_req(req, is_insert=False)
                    self._emit(req)
                batch.filter_batch()
                if batch.is_empty():
                    return
        graphs = self.runner.graph_runner
        batch.prepare_for_decode(graphs.max_bs if graphs is not None else 0)
        self.stats["decode_batches"] += 1
        if len(batch.input_ids) > len(batch.reqs):
            self.stats["jump_decode_batches"] += 1  # jump-forward tokens rode along
            self.stats["jump_row_batches"] += batch.forward_mode.is_decode()  # as a decode batch, a row per token

    # ------------------------------------------------------------------ forward
    def _logits_plan(self, batch: ScheduleBatch):
        """Rows to compute logits for; the sampling requests; the requests verifying a jump-forward draft; per
        request asking for prompt logprobs (req, first input row, end, prefix)."""
        plan = LogitsPlan()
        samplers: list[Req] = []
        verifiers: list[Req] = []
        spans: list[tuple[Req, int, int, int]] = []
        row = 0
        for req, p, e in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
            if batch.forward_mode.is_extend() and req.wants_input_logprobs():
                n_prompt = len(req.origin_input_ids)
                start = len(plan.input_rows)
                for pos in range(p, p + e):
                    if req.logprob_start_len <= pos + 1 < n_prompt:
                        plan.input_rows.append(row + pos - p)
                        plan.input_targets.append(req.fill_ids[pos + 1])
                plan.input_top_k = max(plan.input_top_k, req.top_logprobs_num)
                spans.append((req, start, len(plan.input_rows), p))
            if req.jump_draft:
                # Logits at the last output token and at each draft token (the extend is never chunked then).
                plan.verify_rows.extend(range(row + e - len(req.jump_draft) - 1, row + e))
                verifiers.append(req)
            elif not req.is_chunked:
                plan.sample_rows.append(row + e - 1)
                samplers.append(req)
            row += e
        return plan, samplers, verifiers, spans

    def launch_batch(self, batch: ScheduleBatch) -> BatchResult:
        """Enqueue the forward pass and sampling; nothing here waits for the device."""
        plan, samplers, verifiers, spans = self._logits_plan(batch)
        fb = batch.get_forward_batch(self.runner.token_to_kv_pool, self.runner.attn_backend, self.next_token_buf)
        out: LogitsOutput = self.runner.forward(fb, plan)
        new_reqs = [] if batch is self.running_batch else batch.reqs[batch.num_running :]
        result = BatchResult(list(batch.reqs), new_reqs, batch.forward_mode, out, plan, samplers,
                             verifiers, spans)
        for req, s in zip(batch.reqs, batch.seq_lens):
            req.kv_committed_len = s
        logits = out.next_token_logits  # with CUDA graphs a static buffer: everything reading it is enqueued now
        # Rows whose grammar decides their token on demand need no sampler (nor its parameters on the device).
        sample = bool(samplers) and not self.constrained.decides_all(samplers)
        info = SamplingBatchInfo.from_reqs(samplers, logits.shape[-1], self.device) if sample else None
        result.grammar = self.constrained.prepare_pass(samplers, logits, info, verifiers, out.verify_logits, out.rows)
        if samplers and any(r.return_logprob for r in samplers):
            result.logprobs = torch.log_softmax(logits, dim=-1)
        for req in samplers:
            req.num_pending += 1
        if sample:
            next_ids = self.sampler(logits, info, self.generator)
            if self.overlap:
                rows = fb.req_pool_indices if len(samplers) == fb.batch_size else host_to_device(
                    [r.req_pool_idx for r in samplers], torch.int64, self.device)
                self.next_token_buf[rows] = next_ids
            result.next_ids = HostCopy(next_ids)
        return result

    # ------------------------------------------------------------------ integrity
    def check_memory(self) -> None:
        """NOTE invariant: free + evictable + protected + slots owned by live requests == pool size, and
        every live request's own slots are allocated (not free)."""
        self.tree_cache.check_consistency()
        self.allocator.check_no_double_free()
        ps = self.page_size
        owned = 0
        in_use = [self.tree_cache.all_values_flatten()]
        for req in self._active_reqs():
            if req.req_pool_idx is None:
                continue
            owned += (-(-req.kv_committed_len // ps) - req.cache_protected_len // ps) * ps
            in_use.append(self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_committed_len])
        pages = torch.cat(in_use) // ps
        if pages.numel() and bool(self.allocator.page_is_free[pages].any()):
            raise AssertionError("a KV slot held by the tree or a running request is on the free list")
        total = self.allocator.available_size() + self.tree_cache.evictable_size() + self.tree_cache.protected_size() + owned
        if total != self.allocator.size:
            raise AssertionError(
                f"KV accounting broken: free {self.allocator.available_size()} + evictable {self.tree_cache.evictable_size()} "
                f"+ protected {self.tree_cache.protected_size()} + owned {owned} != {self.allocator.size}"
            )
        if self.is_idle() and self.tree_cache.protected_size() != 0:
            raise AssertionError(f"idle scheduler still protects {self.tree_cache.protected_size()} tokens")
        rows_in_use = sum(1 for r in self._active_reqs() if r.req_pool_idx is not None)
        if self.req_to_token_pool.available_size() + rows_in_use != self.req_to_token_pool.size:
            raise AssertionError("req_to_token rows leaked")


def _overlap_safe(req: Req) -> bool:
    """A request whose next pass needs nothing from the host but its lengths: no grammar mask, no jump-forward,
    no penalty counted over its output tokens."""
    sp = req.sampling_params
    return (req.grammar is None and not req.jump_draft and sp.repetition_penalty == 1.0
            and sp.frequency_penalty == 0.0 and sp.presence_penalty == 0.0)
