"""The offline Engine's requests in flight: each submitted request's state, turned into SGLang-shaped results
({text, output_ids, meta_info}) as the scheduler's outputs arrive (on the scheduler thread), and the ways a caller
waits for them: all at once, a stream, or asyncio."""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.detokenizer import DecodeState
from radixlm.runtime.front import BuiltRequests, ReqState
from radixlm.runtime.messages import (AbortReq, BatchReqOutput, DetokenizeInfo, SchedulerInput,
                                      TokenizedGenerateReqInput)


@dataclass(frozen=True)
class EngineHealth:
    """What callers ask of the Engine's scheduler thread before and while they wait."""

    error: Callable[[], BaseException | None]  # why the scheduler failed, if it did
    stopped: Callable[[], bool]  # shut down
    alive: Callable[[], bool]  # the thread still runs


@dataclass
class Pending:
    """One submitted request, owned by the scheduler thread once submitted."""

    state: ReqState
    decode: DecodeState
    listener: Callable[[Any], None]  # called (in the scheduler thread) with each snapshot dict or an exception


def is_final(snap) -> bool:
    return isinstance(snap, BaseException) or snap["meta_info"]["finish_reason"] is not None


def unwrap(snap) -> dict:
    if isinstance(snap, BaseException):
        raise RuntimeError(f"generation failed: {snap!r}") from snap
    return snap


class ResultCollector:
    def __init__(self, send: Callable[[SchedulerInput], None], tokenizer, health: EngineHealth):
        """send: puts a message in the scheduler's inbox."""
        self.send = send
        self.tokenizer = tokenizer
        self.health = health
        self.states: dict[str, Pending] = {}

    # ------------------------------------------------------------------ scheduler thread
    def deliver(self, outputs: BatchReqOutput) -> None:
        """A step's outputs -> snapshots for the callers (the scheduler's output sink: called while a pass runs)."""
        for i, (rid, ids, finished) in enumerate(zip(outputs.rids, outputs.new_output_ids, outputs.finished_reasons)):
            p = self.states.get(rid)
            if p is None:
                continue
            snapshot = p.state.update_row(outputs, i, p.decode.update(ids, finished))
            if p.state.finished:
                self.states.pop(rid, None)
            p.listener(snapshot)

    def fail(self, error: BaseException) -> None:
        """The scheduler failed: every waiting caller gets the error."""
        for p in list(self.states.values()):
            p.listener(error)
        self.states.clear()

    # ------------------------------------------------------------------ callers
    def submit(self, msg: TokenizedGenerateReqInput, listener, return_text: bool) -> None:
        error = self.health.error()
        if error is not None:
            raise RuntimeError(f"the engine's scheduler has failed: {error!r}")
        if self.health.stopped():
            raise RuntimeError("the engine is shut down")
        state = ReqState(msg.rid, self.tokenizer, msg.return_logprob, return_text)
        self.states[msg.rid] = Pending(state, DecodeState(self.tokenizer, DetokenizeInfo.from_req(msg)), listener)
        self.send(msg)

    def run_prefixes(self, built: BuiltRequests) -> None:
        """Submits built's prefix requests and waits until they finish."""
        waits = []
        for m in built.prefix_requests():
            done = threading.Event()
            self.submit(m, lambda snap, d=done: is_final(snap) and d.set(), False)
            waits.append(done)
        for d in waits:
            d.wait()

    def run_all(self, msgs: list[TokenizedGenerateReqInput], return_text: bool = False) -> list[dict]:
        """Submits msgs and waits for all of them; their final snapshots in order."""
        results: list[Any] = [None] * len(msgs)
        done = threading.Semaphore(0)

        def listener_for(i):
            def listener(snap):
                if is_final(snap):
                    results[i] = snap
                    done.release()
            return listener

        for i, m in enumerate(msgs):
            self.submit(m, listener_for(i), return_text)
        for _ in msgs:
            done.acquire()
        return [unwrap(r) for r in results]

    async def gather(self, msgs: list[TokenizedGenerateReqInput], return_text: bool) -> list[dict]:
        """run_all for an asyncio caller."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in msgs]
        for fut, m in zip(futures, msgs):
            def listener(snap, fut=fut):
                if is_final(snap):
                    loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(snap))
            self.submit(m, listener, return_text)
        return [unwrap(r) for r in await asyncio.gather(*futures)]

    def stream(self, msg: TokenizedGenerateReqInput, return_text: bool) -> Iterator[dict]:
        """Each snapshot of msg as it comes; a caller that stops early aborts it."""
        q: queue.Queue = queue.Queue()
        self.submit(msg, q.put, return_text)
        try:
            while True:
                snap = q.get()
                yield unwrap(snap)
                if is_final(snap):
                    return
        finally:
            if msg.rid in self.states:
                self.send(AbortReq([msg.rid]))

    async def astream(self, msg: TokenizedGenerateReqInput, return_text: bool) -> AsyncIterator[dict]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        self.submit(msg, lambda snap: loop.call_soon_threadsafe(q.put_nowait, snap), return_text)
        try:
            while True:
                snap = await q.get()
                yield unwrap(snap)
                if is_final(snap):
                    return
        finally:
            if msg.rid in self.states:
                self.send(AbortReq([msg.rid]))
