"""What the scheduler process and the offline Engine share: building the model and the Scheduler, and the loop that
feeds the Scheduler its messages and steps it. The process receives from ZMQ, the Engine from a queue.Queue in its
scheduler thread; an Inbox hides which, and callbacks do what differs (where outputs and replies go)."""
from __future__ import annotations

import gc
import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.messages import (
    AbortReq, BatchReqOutput, ControlReply, ExpiredReqs, FlushCacheReq, FlushCacheReqOutput, GetInternalStateReq,
    GetInternalStateReqOutput, LoadLoRAAdapterReqInput, LoRAUpdateOutput, SchedulerInput, ShutdownReq,
    TokenizedGenerateReqInput, UnloadLoRAAdapterReqInput,
)
from radixlm.runtime.scheduler.fault import StepGuard

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.scheduler.scheduler import Scheduler
    from radixlm.runtime.spec.factory import DraftFactory

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
GRAMMAR_WAIT_S = 0.002  # nothing runnable, but grammars are compiling: look at them again soon
CHECK_EVERY_S = 1.0  # keep_going() is asked at least this often while busy
PROGRESS_EVERY_S = 1.0  # at most this long between deliveries while passes run (see SchedulerLoop)
DEADLINE_CHECK_EVERY_S = 0.05  # how often rank 0 looks for requests past a deadline (deadlines.py)
RELEASED_MESSAGE = "the server's memory is released (/release_memory_occupation): resume it first"


@dataclass
class BuiltScheduler:
    model_config: ModelConfig
    tokenizer: PreTrainedTokenizerBase | None
    runner: ModelRunner
    scheduler: Scheduler


def build_scheduler(args: ServerArgs, parallel: Parallel = SINGLE, device: str | None = None) -> BuiltScheduler:
    """Loads the model (this rank's shard of it) and the tokenizer and makes the Scheduler over them; call on the
    thread that runs the loop."""
    # Imported here: the server's main process imports this module (to spawn the scheduler process) and must not
    # load the model code.
    from radixlm.runtime.executor.memory_saver import prepare_allocator
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer
    from radixlm.runtime.scheduler.scheduler import Scheduler
    from radixlm.runtime.spec.budget import draft_reserve
    from radixlm.runtime.spec.factory import DraftFactory

    device = device or args.resolved_device()
    cfg = ModelConfig.from_path(args.model_path, dtype=args.dtype, device=device, context_length=args.context_length,
                                load_format=args.load_format, quantization=args.quantization,
                                is_embedding=args.is_embedding)
    tokenizer = get_tokenizer(args.tokenizer_path or cfg.model_path)
    if args.enable_memory_saver:
        prepare_allocator(device)
    runner = ModelRunner(args, cfg, device, parallel, reserve=draft_reserve(args, cfg))
    scheduler = Scheduler(args, runner, tokenizer, cfg.eos_token_ids, DraftFactory.load(args, runner))
    # The model, tokenizer and graphs are ~340k long-lived objects (a full collection of them took ~0.2 s on the
    # 2-core dev machine): frozen, later collections skip them (the Engine unfreezes them at shutdown).
    gc.collect()
    gc.freeze()
    return BuiltScheduler(cfg, tokenizer, runner, scheduler)


def internal_state(sched: Scheduler) -> dict:
    tc = sched.tree_cache
    return {
        "max_total_num_tokens": sched.allocator.size,
        "available_tokens": sched.allocator.available_size(),
        "evictable_tokens": tc.evictable_size(),
        "protected_tokens": tc.protected_size(),
        "evicted_tokens_total": tc.evicted_tokens_total,
        "num_running_reqs": len(sched._active_reqs()),
        "num_waiting_reqs": len(sched.waiting_queue),
        "is_idle": sched.is_idle(),
        # The deadlines in force (flags, else SGLang's environment variables); None: no limit.
        "req_waiting_timeout_s": sched.deadlines.config.waiting_timeout_s,
        "req_running_timeout_s": sched.deadlines.config.running_timeout_s,
        "weight_version": sched.weight_version,
        "stats": sched.stats_snapshot(),
        "disaggregation": _disaggregation_state(sched),
    }


def _disaggregation_state(sched: Scheduler) -> dict:
    """The side a disaggregated server plays and its rooms (runtime/disaggregation/)."""
    state: dict = {"mode": sched.args.disaggregation_mode.value}
    if sched.pd_prefill is not None:
        state.update(published=sched.pd_prefill.published, written_in_place=sched.pd_prefill.written_in_place
                     + getattr(sched.pd_prefill.sender, "written", 0),
                     unclaimed=sched.pd_prefill.sender.pending())
    if sched.pd_decode is not None:
        state.update(received=sched.pd_decode.received, waiting=len(sched.pd_decode.pending),
                     holding=len(sched.pd_decode.holding()))
    return state


class Inbox(Protocol):
    def recv(self, timeout_s: float) -> SchedulerInput | None:
        """The next message, waiting up to timeout_s for one (0: only one already there); None when none came."""


class QueueInbox:
    """An Inbox over a queue.Queue: callers put from any thread, the loop's thread receives."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()

    def put(self, msg: SchedulerInput) -> None:
        self._queue.put(msg)

    def recv(self, timeout_s: float) -> SchedulerInput | None:
        try:
            return self._queue.get(timeout=timeout_s) if timeout_s > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None


@dataclass
class SchedulerLoop:
    """Receives messages without waiting while there is work, waits briefly when idle, steps the scheduler through
    a StepGuard and delivers its outputs; returns on a ShutdownReq or when keep_going() says no. A step that cannot
    go on raises FatalSchedulerError (the owner decides what that means).

    Tensor parallel: every rank runs this loop over its own Scheduler. Only rank 0 has an inbox; each turn it sends
    what it received (and whether to stop) to the other ranks, so that all ranks see the same inputs at the same
    step and make the same decisions. A failed step is then fatal: the ranks could not recover alike."""

    sched: Scheduler
    inbox: Inbox | None  # None on ranks other than 0
    # Also the scheduler's output sink: outputs go out while the device runs the next pass.
    deliver: Callable[[BatchReqOutput], None]
    reply: Callable[[SchedulerInput, ControlReply], None]
    keep_going: Callable[[], bool]  # asked after an idle wait that brought nothing, and every CHECK_EVERY_S
    on_request: Callable[[TokenizedGenerateReqInput], None] | None = None  # each request, before the scheduler
    parallel: Parallel = SINGLE
    progress_every_s: float = PROGRESS_EVERY_S

    def __post_init__(self) -> None:
        from radixlm.runtime.scheduler.weights_control import UPDATES, WEIGHTS_REQUESTS, WeightsControl

        self._weights_types, self._update_types = WEIGHTS_REQUESTS, UPDATES
        self.weights = WeightsControl(self.sched)
        # A weights request waits here until the requests before it are done; what came after it waits behind it
        # (each entry: the message and, for an update, how many requests it aborted).
        self._held: deque[tuple[SchedulerInput, int]] = deque()
        self.sched.output_sink = self._deliver
        self._last_check = time.monotonic()
        self._last_delivery = time.monotonic()
        self._delivered_progress = self.sched.progress()
        self._deadlines_checked = float("-inf")

    def _deliver(self, outputs: BatchReqOutput) -> None:
        self._last_delivery = time.monotonic()
        self._delivered_progress = self.sched.progress()
        self.deliver(outputs)

    def run(self) -> None:
        sched, guard = self.sched, StepGuard(self.sched, fatal=self.parallel.tp_size > 1)
        while True:
            idle = sched.is_idle()
            wait_s = IDLE_WAIT_S if idle else GRAMMAR_WAIT_S if sched.nothing_to_run() else 0.0
            msgs, stop = self._inputs(wait_s, idle)
            aborts: list[str] = []
            for msg in msgs:
                self._handle(msg, aborts)
            if aborts:
                sched.abort_requests(aborts)  # one pass over the queues for all of them
            if stop:
                return
            self._run_held()
            for unload, result in sched.lora.finish_unloads() if sched.lora is not None else ():
                self.reply(unload, result)  # each once no request uses its adapter
            if not sched.is_idle():
                outputs = guard.step()
                if outputs or (sched.progress() != self._delivered_progress
                               and time.monotonic() - self._last_delivery >= self.progress_every_s):
                    self._deliver(outputs)
                self._run_held()

    def _inputs(self, wait_s: float, idle: bool) -> tuple[list[SchedulerInput], bool]:
        """This turn's messages and whether to stop: rank 0's, on every rank (None on the wire: nothing new)."""
        got = self._receive(wait_s, idle) if self.inbox else None
        if self.parallel.tp_size > 1:
            got = self.parallel.broadcast_object(got if got is not None and (got[0] or got[1]) else None)
        return got if got is not None else ([], False)

    def _receive(self, wait_s: float, idle: bool) -> tuple[list[SchedulerInput], bool]:
        """(the messages waiting, up to wait_s for the first; whether to stop once they are handled): a ShutdownReq,
        or keep_going() saying no after an idle wait that brought nothing or CHECK_EVERY_S after the last question."""
        msgs: list[SchedulerInput] = []
        msg = self.inbox.recv(wait_s)
        while msg is not None:
            if isinstance(msg, ShutdownReq):
                return msgs, True
            msgs.append(msg)
            msg = self.inbox.recv(0.0)
        now = time.monotonic()
        if now - self._deadlines_checked >= DEADLINE_CHECK_EVERY_S:
            # Rank 0 reads the clock and every rank aborts the same requests (the message is broadcast).
            self._deadlines_checked = now
            expired = self.sched.expired(now)
            if expired:
                msgs.append(ExpiredReqs(expired))
        if (not msgs and idle) or time.monotonic() - self._last_check > CHECK_EVERY_S:
            self._last_check = time.monotonic()
            if not self.keep_going():
                return msgs, True
        return msgs, False

    def _handle(self, msg: SchedulerInput, aborts: list[str]) -> None:
        if isinstance(msg, AbortReq):
            aborts += msg.rids
            wanted = set(msg.rids)
            taken = {id(m) for m, _ in self._held if isinstance(m, TokenizedGenerateReqInput) and m.rid in wanted}
            if taken:
                for m, _ in self._held:
                    if id(m) in taken:
                        self._handle_now(m)  # queued now, and aborted with the others below
                self._held = deque(e for e in self._held if id(e[0]) not in taken)
        elif isinstance(msg, ExpiredReqs):
            self.sched.abort_expired(msg.aborts)  # never held: a deadline does not wait for a weight update
        elif isinstance(msg, self._weights_types) or (self._held and not isinstance(msg, GetInternalStateReq)):
            paused = 0
            if isinstance(msg, self._update_types) and msg.abort_all_requests:
                paused = self.sched.abort_all("aborted for a weight update")
            self._held.append((msg, paused))
        else:
            self._handle_now(msg)

    def _run_held(self) -> None:
        """Applies the weights requests at the head of the held messages once the scheduler is idle, and hands it
        what was held behind each."""
        while self._held:
            msg, paused = self._held[0]
            if isinstance(msg, self._weights_types):
                if not self.sched.is_idle():
                    return
                self._held.popleft()
                out = self.weights.handle(msg)
                out.num_paused_requests = paused
                self.reply(msg, out)
            else:
                self._held.popleft()
                self._handle_now(msg)

    def _handle_now(self, msg: SchedulerInput) -> None:
        if isinstance(msg, TokenizedGenerateReqInput):
            if self.on_request is not None:
                self.on_request(msg)
            if self.weights.released:
                self.sched.refuse(msg, RELEASED_MESSAGE, 503)
            else:
                self.sched.add_request(msg)
        elif isinstance(msg, FlushCacheReq):
            self.reply(msg, FlushCacheReqOutput(self.sched.flush_cache()))
        elif isinstance(msg, GetInternalStateReq):
            self.reply(msg, GetInternalStateReqOutput(internal_state(self.sched)))
        elif isinstance(msg, (LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput)) and self.sched.lora is None:
            self.reply(msg, LoRAUpdateOutput(msg.lora_id, False, "LoRA serving is off: start with --enable-lora"))
        elif isinstance(msg, LoadLoRAAdapterReqInput):
            self.reply(msg, self.sched.lora.load(msg))
        elif isinstance(msg, UnloadLoRAAdapterReqInput):
            self.sched.lora.unloads.append(msg)  # answered by finish_unloads
        else:
            logger.warning("scheduler loop: ignoring a message of type %s", type(msg).__name__)
