"""TokenizerManager (main process, asyncio): validates and tokenizes requests via the shared front,
sends them to the scheduler, matches the detokenizer's text outputs to waiting requests, and fails
every pending request when a child process dies."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from radixlm.runtime.embeddings import build_embed_requests
from radixlm.runtime.errors import ApiError
from radixlm.runtime.front import BuiltRequests, FrontLimits, ReqState, RequestBuilder
from radixlm.runtime.ipc import bind_pull, connect_push
from radixlm.runtime.launch import LaunchedRuntime
from radixlm.runtime.lora.registry import LoraRegistry, startup_refs
from radixlm.runtime.messages import (
    AbortReq, BatchStrOutput, FlushCacheReq, FlushCacheReqOutput, GetInternalStateReq, GetInternalStateReqOutput,
    LoadLoRAAdapterReqInput, LoRAUpdateOutput, ShutdownReq, TokenizedGenerateReqInput, UnloadLoRAAdapterReqInput,
    WeightsReqInput, WeightsReqOutput,
)
from radixlm.runtime.metrics import ReqTiming, ServerMetrics
from radixlm.runtime.multimodal.media import MediaLoader, MediaPolicy
from radixlm.runtime.multimodal.processor import MultimodalProcessor

logger = logging.getLogger(__name__)

LORA_LOAD_TIMEOUT_S = 300.0  # reading an adapter from disk
YIELD_EVERY = 64  # requests built or sent between turns of the event loop (a large batch must not starve /health)


class RuntimeDead(RuntimeError):
    """A child process died or the scheduler stalled: the server cannot serve any more."""


class RequestFailed(ApiError):
    """The scheduler ended a request with an error (an abort carrying a status code): answered with that status."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.status_code = status_code


def _raise_if_failed(snap: dict) -> None:
    fr = snap["meta_info"]["finish_reason"]
    if fr is not None and fr.get("type") == "abort" and (fr.get("status_code") or 0) >= 400:
        raise RequestFailed(fr.get("message") or "the request failed", fr["status_code"])


@dataclass
class _ReqEntry:
    """Set by TokenizerManager._submit; fed by its receive loop. Outputs that arrive while the request's reader is
    busy (sending the previous chunk) are read as one snapshot (SGLang's streams coalesce alike): snapshots are
    cumulative, so a reader that falls behind gets fewer, larger chunks and never a stale backlog."""

    state: ReqState
    timing: ReqTiming | None  # None: not counted in the metrics (internal prefix-warming requests)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set when outputs or an error came since the last read
    error: BaseException | None = None  # a RuntimeDead or RequestFailed: raised by the next read
    finished: bool = False

    def deliver(self) -> None:
        """The receive loop added outputs to state."""
        self.wake.set()

    def fail(self, error: BaseException) -> None:
        self.finished = True
        self.error = error
        self.wake.set()

    async def next_snapshot(self) -> dict:
        """The snapshot of everything received so far, once something new came (raises the request's error)."""
        await self.wake.wait()
        self.wake.clear()
        if self.error is not None:
            raise self.error
        return self.state.snapshot()

    async def final(self) -> dict:
        """The finished request's snapshot; no snapshot is built before it finishes."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.error is not None:
                raise self.error
            if self.state.finished:
                return self.state.snapshot()


class TokenizerManager:
    def __init__(self, runtime: LaunchedRuntime, tokenizer):
        self.runtime = runtime
        self.server_args = runtime.server_args
        self.tokenizer = tokenizer
        info = runtime.info
        self.builder = RequestBuilder(tokenizer, FrontLimits(
            info.vocab_size, info.context_len, info.max_total_num_tokens, self.server_args.disable_radix_cache,
            self.server_args.max_logprobs, info.embedding_dim), MultimodalProcessor.for_model(
                info.model_path, tokenizer, MediaLoader(MediaPolicy.from_args(self.server_args))),
            LoraRegistry(self.server_args.enable_lora, startup_refs(self.server_args.lora_paths)),
            self.server_args.reasoning_parser)
        self.rid_to_state: dict[str, _ReqEntry] = {}
        self.dead: str | None = None
        self.ready = False  # set after the warm-up generation succeeded
        self.instance_id = uuid.uuid4().hex  # a restarted server has another one (its cache starts empty)
        self._replies: dict[type, deque[asyncio.Future]] = {
            FlushCacheReqOutput: deque(), GetInternalStateReqOutput: deque(), WeightsReqOutput: deque()}
        self._lora_replies: dict[str, asyncio.Future] = {}  # a load's or unload's lora_id -> its answer
        self.weight_version = "default"  # the scheduler's, as its last answer to a weights request said
        self._tasks: list[asyncio.Task] = []
        self.metrics = ServerMetrics()
        # Last message from the pipeline, or the moment work became pending after an idle spell.
        self.last_progress = time.monotonic()
        self.in_flight_http = 0  # generation HTTP requests admitted and not yet answered (set by the app)
        # Called once when the pipeline is found dead (set by serve(): the server then exits non-zero).
        self.on_dead: Callable[[str], None] | None = None
        self._last_state: dict | None = None  # the scheduler's last reported internal state (set by get_internal_state)
        self._last_state_at = 0.0

    async def start(self) -> None:
        """Call from the serving event loop."""
        self.ctx = zmq.asyncio.Context()
        self.recv = bind_pull(self.ctx, self.runtime.ports.tokenizer_input)
        self.to_scheduler = connect_push(self.ctx, self.runtime.ports.scheduler_input)
        self._tasks = [asyncio.create_task(self._recv_loop()), asyncio.create_task(self._watchdog())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self.dead is None:
            try:
                self.to_scheduler.send_pyobj(ShutdownReq(), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self.ctx.destroy(linger=0)

    # ------------------------------------------------------------------ loops
    async def _recv_loop(self) -> None:
        while True:
            msg = await self.recv.recv_pyobj()
            self.last_progress = time.monotonic()
            if isinstance(msg, BatchStrOutput):
                now = time.perf_counter()
                outs = msg.outputs
                for i, (rid, text) in enumerate(zip(outs.rids, msg.texts)):
                    entry = self.rid_to_state.get(rid)
                    if entry is None:
                        continue
                    entry.state.add_row(outs, i, text)
                    if entry.timing is not None:
                        self.metrics.on_output(entry.timing, now, len(outs.new_output_ids[i]), outs.queue_times[i])
                    if entry.state.finished:
                        entry.finished = True
                        del self.rid_to_state[rid]
                        if (outs.finished_reasons[i] or {}).get("status_code"):
                            self._send_aborts([rid])  # failed outside the scheduler (detokenizing): stop it there
                        if entry.timing is not None:
                            self.metrics.on_finish(entry.timing, now, outs.prompt_tokens[i], outs.cached_tokens[i])
                    entry.deliver()
            elif isinstance(msg, LoRAUpdateOutput):
                fut = self._lora_replies.pop(msg.lora_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif type(msg) in self._replies:
                waiting = self._replies[type(msg)]
                if waiting:
                    fut = waiting.popleft()
                    if not fut.done():
                        fut.set_result(msg)

    async def _watchdog(self) -> None:
        timeout = self.server_args.watchdog_timeout
        while self.dead is None:
            await asyncio.sleep(min(0.5, timeout / 4))
            reason = self.runtime.dead_child()
            pending = bool(self.rid_to_state) or any(self._replies.values()) or bool(self._lora_replies)
            if reason is None and pending and time.monotonic() - self.last_progress > timeout:
                reason = f"watchdog: the scheduler made no progress for {timeout:g}s with requests pending"
            if reason is not None:
                self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        self.dead = reason
        logger.error("%s; failing %d pending request(s)", reason, len(self.rid_to_state))
        for entry in self.rid_to_state.values():
            # A 500, not a 503: the request was accepted and may be what killed the pipeline, so a router must not
            # resend it to another worker (a 503 means "not taken, try elsewhere").
            entry.fail(RequestFailed(f"{reason} while this request was running", 500))
        self.rid_to_state.clear()
        for waiting in self._replies.values():
            while waiting:
                f = waiting.popleft()
                if not f.done():
                    f.set_exception(RuntimeDead(reason))
        if self.on_dead is not None:
            self.on_dead(reason)

    def _mark_pending(self) -> None:
        # The stall clock starts when work arrives at an idle pipeline, not at its last output.
        if not self.rid_to_state and not any(self._replies.values()):
            self.last_progress = time.monotonic()

    # ------------------------------------------------------------------ admission
    def in_flight(self) -> int:
        return max(self.in_flight_http, len(self.rid_to_state))

    def admit(self) -> bool:
        """Counts one generation HTTP request in, or refuses it (False) when the queue is full."""
        extra = self.server_args.max_queued_requests
        if extra is not None and self.in_flight() >= self.runtime.info.max_running_requests + extra:
            return False
        self.in_flight_http += 1
        return True

    def release(self) -> None:
        self.in_flight_http -= 1

    # ------------------------------------------------------------------ requests
    def build(self, **kwargs) -> BuiltRequests:
        """Raises ValueError for invalid input: nothing reaches the scheduler then."""
        return self.builder.build(**kwargs)

    def build_embed(self, **kwargs) -> BuiltRequests:
        """Embedding / rerank requests (--is-embedding); raises ValueError for invalid input."""
        return build_embed_requests(self.builder, **kwargs)

    async def build_async(self, **kwargs) -> BuiltRequests:
        """build, letting other requests run between chunks of a large batch."""
        if kwargs.get("image_data") is not None or kwargs.get("video_data") is not None:
            # Fetching, decoding and preprocessing media: off the event loop.
            return await asyncio.to_thread(self.builder.build, **kwargs)
        steps = self.builder.build_steps(**kwargs)
        made = 0
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            made += 1
            if made % YIELD_EVERY == 0:
                await asyncio.sleep(0)

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise RuntimeDead(self.dead)

    def _submit(self, msg: TokenizedGenerateReqInput, return_text: bool, log_metrics: bool = True) -> _ReqEntry:
        self._check_alive()
        if msg.rid in self.rid_to_state:
            raise ValueError(f"duplicate request id {msg.rid!r}")
        state = ReqState(msg.rid, self.tokenizer, msg.return_logprob, return_text)
        entry = _ReqEntry(state, ReqTiming(state.created, msg.stream) if log_metrics else None)
        self._mark_pending()
        self.rid_to_state[msg.rid] = entry
        self.to_scheduler.send_pyobj(msg)
        return entry

    async def _final(self, entry: _ReqEntry) -> dict:
        snap = await entry.final()
        _raise_if_failed(snap)
        return snap

    async def _submit_all(self, msgs, return_text: bool, log_metrics: bool, entries: list[_ReqEntry]) -> list[_ReqEntry]:
        """Submits msgs (appending each entry to `entries` at once, so a cancellation aborts what was sent)."""
        mine = []
        for i, m in enumerate(msgs):
            e = self._submit(m, return_text, log_metrics)
            mine.append(e)
            entries.append(e)
            if (i + 1) % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        return mine

    async def generate(self, built: BuiltRequests, return_text: bool, log_metrics: bool = True) -> dict | list[dict]:
        """Runs non-streaming requests; aborts the unfinished ones if cancelled (client disconnect)."""
        for rid in {m.rid for m in built.msgs}:
            if rid in self.rid_to_state:
                raise ValueError(f"duplicate request id {rid!r}")
        entries: list[_ReqEntry] = []
        try:
            prefixes = await self._submit_all(built.prefix_requests(), False, False, entries)
            await asyncio.gather(*(self._final(e) for e in prefixes))
            mine = await self._submit_all(built.msgs, return_text, log_metrics, entries)
            results = await asyncio.gather(*(self._final(e) for e in mine))
        finally:
            self._abort_unfinished(entries)
        return results if built.as_list else results[0]

    async def generate_stream(self, msg: TokenizedGenerateReqInput, return_text: bool) -> AsyncIterator[dict]:
        entry = self._submit(msg, return_text)
        try:
            while True:
                snap = await entry.next_snapshot()
                if snap["meta_info"]["finish_reason"] is not None:
                    _raise_if_failed(snap)
                    yield snap
                    return
                yield snap
        finally:
            self._abort_unfinished([entry])

    def _abort_unfinished(self, entries: list[_ReqEntry]) -> None:
        self._send_aborts([e.state.rid for e in entries
                           if not e.finished and self.rid_to_state.get(e.state.rid) is e])

    def abort_request(self, rid: str | None = None, abort_all: bool = False) -> list[str]:
        """Aborts rid (and its n > 1 samples rid-0, rid-1, ...) or everything; returns the rids aborted."""
        if abort_all:
            rids = list(self.rid_to_state)
        else:
            rids = [r for r in self.rid_to_state if r == rid or (rid and r.startswith(f"{rid}-"))]
            if rid and rid not in rids:
                rids.append(rid)  # it may still be in the scheduler's queue
        self._send_aborts(rids)
        return rids

    def _send_aborts(self, rids: list[str]) -> None:
        if self.dead is None and rids:
            self.to_scheduler.send_pyobj(AbortReq(rids))

    async def _ask(self, req: Any, reply_type: type, timeout: float | None = 30.0):
        self._check_alive()
        self._mark_pending()
        fut = asyncio.get_running_loop().create_future()
        self._replies[reply_type].append(fut)
        self.to_scheduler.send_pyobj(req)
        return await asyncio.wait_for(fut, timeout)

    async def _ask_lora(self, msg: LoadLoRAAdapterReqInput | UnloadLoRAAdapterReqInput,
                        timeout: float | None) -> LoRAUpdateOutput:
        self._check_alive()
        self._mark_pending()
        fut = asyncio.get_running_loop().create_future()
        self._lora_replies[msg.lora_id] = fut
        self.to_scheduler.send_pyobj(msg)
        try:
            out = await asyncio.wait_for(fut, timeout)
        finally:
            self._lora_replies.pop(msg.lora_id, None)
        return dataclasses.replace(out, loaded_adapters=self.builder.lora.loaded())

    async def load_lora_adapter(self, name, path, pinned: bool = False) -> LoRAUpdateOutput:
        """Reads an adapter in the scheduler, then lets requests name it (ValueError: LoRA off, a bad or taken name)."""
        ref = self.builder.lora.new_ref(name, path, pinned)
        success = False
        try:
            out = await self._ask_lora(LoadLoRAAdapterReqInput(ref.lora_name, ref.lora_path, ref.lora_id, ref.pinned),
                                       LORA_LOAD_TIMEOUT_S)
            success = out.success
        finally:
            self.builder.lora.finish_load(ref, success)
        return dataclasses.replace(out, loaded_adapters=self.builder.lora.loaded())

    async def unload_lora_adapter(self, name) -> LoRAUpdateOutput:
        """New requests may no longer name it; answered once the requests using it have finished (ValueError: no
        adapter of that name)."""
        ref = self.builder.lora.remove(name)
        return await self._ask_lora(UnloadLoRAAdapterReqInput(ref.lora_name, ref.lora_id), None)

    async def flush_cache(self) -> bool:
        return (await self._ask(FlushCacheReq(), FlushCacheReqOutput)).success

    async def weights_request(self, req: WeightsReqInput) -> WeightsReqOutput:
        """A weight update or memory request: answered once the requests before it are done and it has run (no
        timeout: a checkpoint may take long to load; the watchdog covers a stalled scheduler)."""
        out = await self._ask(req, WeightsReqOutput, timeout=None)
        self.weight_version = out.weight_version
        return out

    async def get_internal_state(self, timeout: float = 30.0, allow_stale: bool = False) -> dict:
        """The scheduler's state. allow_stale: if it does not answer within timeout (a long pass), the last state
        it reported, with `stale_s` saying how old (raises asyncio.TimeoutError when there is none)."""
        try:
            state = (await self._ask(GetInternalStateReq(), GetInternalStateReqOutput, timeout)).state
        except asyncio.TimeoutError:
            if not allow_stale or self._last_state is None:
                raise
            return {**self._last_state, "stale_s": time.monotonic() - self._last_state_at}
        self._last_state, self._last_state_at = state, time.monotonic()
        return state
