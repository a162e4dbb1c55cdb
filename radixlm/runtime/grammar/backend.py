"""The grammar backend interface, and GrammarCache: compiled grammars shared by all requests, compiled on worker
threads so that the scheduler loop never waits for a compiler."""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from radixlm.runtime.grammar.spec import GrammarSpec


class GrammarMatcher(ABC):
    """One request's position in its grammar."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) when the grammar does not allow it."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None: ...

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into row `row` of a bitmask from GrammarBackend.allocate_bitmask."""

    @abstractmethod
    def is_completed(self) -> bool:
        """What was accepted is a complete string of the grammar: a stop token is allowed next."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token accepted: the request ends."""

    @abstractmethod
    def jump_forward_string(self) -> str:
        """The text every continuation must start with from here ('' when there is a choice)."""


class GrammarBackend(ABC):
    @abstractmethod
    def compile(self, spec: GrammarSpec) -> Any:
        """Blocking; runs on a GrammarCache worker thread. Raises InvalidGrammar."""

    @abstractmethod
    def new_matcher(self, compiled: Any) -> GrammarMatcher: ...

    def fill_bitmasks(self, matchers: list[GrammarMatcher], bitmask: torch.Tensor, rows: list[int]) -> None:
        """Fill `rows` of the bitmask for a batch's matchers (a backend may do this in parallel)."""
        for m, row in zip(matchers, rows):
            m.fill_bitmask(bitmask, row)

    @abstractmethod
    def allocate_bitmask(self, batch_size: int) -> torch.Tensor:
        """A bitmask for `batch_size` rows with every token allowed."""

    @abstractmethod
    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """In place: the disallowed tokens of `rows` get -inf."""


class GrammarCache:
    """Compiled grammars keyed by (kind, spec). `get` never blocks: it returns a Future that the caller polls;
    concurrent requests for one spec share one compilation, and a failed compilation is cached too. The backend
    is built by `make_backend` on a worker thread, at the first compilation (it preprocesses the vocabulary)."""

    def __init__(self, make_backend: Callable[[], GrammarBackend], max_workers: int = 2, max_entries: int = 4096):
        self._make_backend = make_backend
        self._backend: GrammarBackend | None = None
        self.max_entries = max_entries
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        self._entries: dict[GrammarSpec, Future] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def backend(self) -> GrammarBackend:
        """Built by the time any compilation has finished."""
        with self._lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def _compile(self, spec: GrammarSpec) -> Any:
        return self.backend.compile(spec)

    def get(self, spec: GrammarSpec) -> Future:
        with self._lock:
            fut = self._entries.get(spec)
            if fut is not None:
                self.hits += 1
                self._entries[spec] = self._entries.pop(spec)  # most recently used last
                return fut
            self.misses += 1
            while len(self._entries) >= self.max_entries:
                self._entries.pop(next(iter(self._entries)))
            fut = self._pool.submit(self._compile, spec)
            self._entries[spec] = fut
            return fut

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
