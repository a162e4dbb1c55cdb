"""Requests waiting for their grammar to compile (off the scheduler's critical path, on GrammarCache's threads).

A request with a grammar lives: grammar queue (compiling) -> waiting -> prefill -> decode."""
from __future__ import annotations

from collections.abc import Callable

from radixlm.runtime.grammar.backend import GrammarBackend, GrammarCache
from radixlm.runtime.grammar.spec import GrammarSpec
from radixlm.runtime.scheduler.req import FinishReason, Req


def grammar_backend(name: str, tokenizer, vocab_size: int, eos_token_ids: frozenset[int]) -> GrammarBackend:
    """--grammar-backend's backend over the model's tokenizer (built on a compile thread, at first use)."""
    if tokenizer is None:
        raise RuntimeError("constrained decoding needs the model's tokenizer")
    if name != "xgrammar":
        raise ValueError(f"unknown grammar backend {name!r}")
    from radixlm.runtime.grammar.xgrammar_backend import XGrammarBackend

    return XGrammarBackend(tokenizer, vocab_size, sorted(eos_token_ids))


class GrammarQueue:
    def __init__(self, cache: GrammarCache, agree: Callable[[list[bool]], list[bool]] | None = None):
        self.cache = cache
        self.queue: list[Req] = []  # waiting for their grammar to compile
        # Tensor parallel: each rank compiles on its own threads, so "done" is what all ranks say is done
        # (Parallel.all_true); a request then always passes through the queue, even when its grammar is cached.
        self.agree = agree

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
        if req.grammar_future.done() and self.agree is None:
            return False
        self.queue.append(req)
        return True

    def pop_ready(self) -> list[Req]:
        """Requests whose grammar finished compiling (failed ones come back finished with an abort)."""
        done = [r.grammar_future.done() for r in self.queue]
        if self.agree is not None:
            done = self.agree(done)
        ready = [r for r, d in zip(self.queue, done) if d]
        if ready:
            self.queue = [r for r, d in zip(self.queue, done) if not d]
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
