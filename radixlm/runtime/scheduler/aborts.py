"""Aborting requests (a client's, a deadline's, abort-all): a request not yet running finishes at once; a running one
is marked and finishes at the next step's safe point, once its tokens in flight are on the host, so that its KV is
released with them."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from radixlm.runtime.scheduler.deadlines import Deadlines, Expired
from radixlm.runtime.scheduler.disagg import Disaggregation
from radixlm.runtime.scheduler.grammar_queue import GrammarQueue
from radixlm.runtime.scheduler.outbox import Outbox, ReqQueues
from radixlm.runtime.scheduler.planner import Planner
from radixlm.runtime.scheduler.req import FinishReason, Req


class Aborts:
    def __init__(self, queues: ReqQueues, grammar_queue: GrammarQueue, disagg: Disaggregation, planner: Planner,
                 outbox: Outbox, deadlines: Deadlines, stats: Counter, sync_inflight: Callable[[], None]):
        """sync_inflight: processes the pass in flight (the scheduler's)."""
        self.queues = queues
        self.grammar_queue = grammar_queue
        self.disagg = disagg
        self.planner = planner
        self.outbox = outbox
        self.deadlines = deadlines
        self.stats = stats
        self.sync_inflight = sync_inflight
        self.pending = False  # some running request has to_abort set

    def active(self) -> list[Req]:
        """The running requests and the one prefilled in chunks, unfinished."""
        reqs = [r for r in self.queues.running if not r.finished()]
        chunked = self.queues.chunked
        if chunked is not None and not chunked.finished():
            reqs.append(chunked)
        return reqs

    def held(self) -> list[Req]:
        """Every request the scheduler holds: queued, compiling its grammar, running, waiting for its KV."""
        return [*self.queues.waiting, *self.grammar_queue.queue, *self.active(), *self.disagg.pending()]

    def abort(self, reasons: dict[str, FinishReason]) -> None:
        """Waiting requests finish at once; running ones at the next step's safe point (process)."""
        self.disagg.abort(reasons)
        queued = self.grammar_queue.take(set(reasons))
        kept = []
        for req in self.queues.waiting:
            (queued if req.rid in reasons and req.req_pool_idx is None else kept).append(req)
        self.queues.waiting = kept
        for req in queued:
            req.finished_reason = reasons[req.rid]
            self.outbox.emit(req)
        for req in self.active():
            if req.rid in reasons:
                req.to_abort = reasons[req.rid]
                self.pending = True

    def expired(self, now: float) -> list[Expired]:
        """The requests past a deadline at `now` (deadlines.py); [] at once when none can expire."""
        if not self.deadlines.active:
            return []
        return self.deadlines.expired(self.held(), now)

    def abort_expired(self, expired: list[Expired]) -> None:
        if expired:
            self.stats["deadline_aborts"] += len(expired)
            self.abort({rid: FinishReason.aborted(message, status) for rid, message, status in expired})

    def process(self) -> None:
        """The safe point: marked requests finish and release their KV."""
        if self.pending:
            self.pending = False
            self.sync_inflight()  # an aborted request's KV is released with its tokens on the host
            for req in self.active():
                if req.to_abort is not None and not req.finished():
                    req.finished_reason = req.to_abort
                    self.planner.release(req)
                    if req is self.queues.chunked:
                        self.queues.chunked = None
                    self.outbox.emit(req)
        self.queues.drop_finished()
