"""Requests waiting for their grammar to compile (off the scheduler's critical path, on GrammarCache's threads).

A request with a grammar lives: grammar queue (compiling) -> waiting -> prefill -> decode."""
from __future__ import annotations

from radixlm.runtime.grammar.backend import GrammarBackend, GrammarCache
from radixlm.runtime.grammar.spec import GrammarSpec
from radixlm.runtime.scheduler.req import FinishReason, Req


class GrammarQueue:
    def __init__(self, cache: GrammarCache):
        self.cache = cache
        self.queue: list[Req] = []  # waiting for their grammar to compile

    @property
    def backend(self) -> GrammarBackend:
        """Built by the time any grammar has compiled."""
        return self.cache.backend

    def add(self, req: Req) -> bool:
        """Attach the request's grammar; True when it must wait in `queue` for the compiler."""
        spec = GrammarSpec.from_sampling_params(req.sampling_params)
        if spec is None:
            return False
        req.grammar_future = self.cache.get(spec)
        if req.grammar_future.done():
            return False
        self.queue.append(req)
        return True

    def pop_ready(self) -> list[Req]:
        """Requests whose grammar finished compiling (failed ones come back finished with an abort)."""
        ready = [r for r in self.queue if r.grammar_future.done()]
        if ready:
            self.queue = [r for r in self.queue if not r.grammar_future.done()]
        return ready

    def start(self, req: Req) -> None:
        """The grammar is compiled: give the request its own matcher (or finish it when compilation failed)."""
        fut, req.grammar_future = req.grammar_future, None
        if fut is None:
            return
        if fut.exception() is not None:
            # The API layer validates specs, so this is a spec its parser accepted but the compiler did not.
            req.finished_reason = FinishReason.aborted(str(fut.exception()), status_code=400)
            return
        req.grammar = self.cache.backend.new_matcher(fut.result())

    def take(self, rids: set[str]) -> list[Req]:
        """Removes and returns the queued requests with these rids."""
        taken = [r for r in self.queue if r.rid in rids]
        if taken:
            self.queue = [r for r in self.queue if r.rid not in rids]
        return taken

    def shutdown(self) -> None:
        self.cache.shutdown()
