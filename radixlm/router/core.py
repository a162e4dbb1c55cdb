"""The Router: worker registry + policy + the shared approximate tree + metrics. HTTP lives in app.py."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import httpx

from radixlm.router.args import RouterArgs
from radixlm.router.failures import Effect, Failure
from radixlm.router.feedback import CacheFeedback, CacheState, FeedbackConfig
from radixlm.router.metrics import RouterMetrics
from radixlm.router.policies import CacheAwareConfig, RoutingRequest, make_policy
from radixlm.router.quarantine import QuarantineStore
from radixlm.router.tree import ApproxRadixTree
from radixlm.router.usage import Usage
from radixlm.router.workers import CircuitConfig, HealthConfig, Worker, WorkerRegistry

logger = logging.getLogger(__name__)


class Router:
    def __init__(self, args: RouterArgs, client: httpx.AsyncClient) -> None:
        self.args = args
        self.client = client
        # Every policy feeds the tree (it also gives the hit-rate estimate); only cache_aware routes on it.
        self.tree = ApproxRadixTree()
        self.policy = make_policy(
            args.policy, self.tree,
            CacheAwareConfig(args.cache_threshold, args.balance_abs_threshold, args.balance_rel_threshold),
            seed=args.random_seed, prefix_chars=4 * args.prefix_token_count, load_factor=args.prefix_hash_load_factor)
        self.registry = WorkerRegistry(
            HealthConfig(args.health_failure_threshold, args.health_success_threshold,
                         args.health_check_timeout_secs, args.health_check_interval_secs, args.health_check_endpoint),
            CircuitConfig(args.cb_failure_threshold, args.cb_success_threshold, args.cb_timeout_duration_secs,
                          enabled=not args.disable_circuit_breaker),
            client)
        self.registry.listeners.append(self)
        self.metrics = RouterMetrics()
        self.est_cached_chars = 0  # set by select()
        self.est_input_chars = 0  # set by select()
        self.decisions: dict[str, int] = {}  # cache_aware decisions by mode (set by select())
        self.quarantine = QuarantineStore(args.quarantine_secs)
        self.feedback = CacheFeedback(self.tree, FeedbackConfig(enabled=args.cache_feedback), self.metrics)
        for url in args.worker_urls:
            self.registry.add(url)

    # ---- WorkerListener ------------------------------------------------------------------------
    def worker_added(self, url: str) -> None:
        self.tree.add_tenant(url)

    def worker_removed(self, url: str) -> None:
        self.tree.remove_tenant(url)
        self.feedback.forget(url)

    def worker_down(self, url: str) -> None:
        # A worker that went down comes back (if at all) with a cold cache: stop crediting it.
        self.tree.clear_tenant(url)

    # ---- routing -------------------------------------------------------------------------------
    def select(self, req: RoutingRequest, exclude: set[str] = frozenset(),
               allow: Callable[[list[str]], list[str]] | None = None) -> tuple[Worker, int] | None:
        """Picks a worker (None when no eligible one is left) and records the text under it at selection
        time; `allow` narrows the eligible workers (by URL) further. Returns the worker and how many characters
        the tree believed it already held."""
        candidates = [w for w in self.registry.eligible() if w.url not in exclude]
        if allow is not None:
            allowed = set(allow([w.url for w in candidates]))
            candidates = [w for w in candidates if w.url in allowed]
        if not candidates:
            return None
        w = self.policy.select(candidates, req)
        w.selections += 1
        self.metrics.selections.labels(w.url, self.policy.name).inc()
        mode = getattr(self.policy, "last_mode", "")
        if mode:
            self.decisions[mode] = self.decisions.get(mode, 0) + 1
            self.metrics.decisions.labels(mode).inc()
        held = 0
        if req.text:
            held = self.tree.match_tenant(req.text, w.url)
            self.tree.insert(req.text, w.url)
            self.est_cached_chars += held
            self.est_input_chars += len(req.text)
            self.metrics.est_cached_chars.inc(held)
            self.metrics.est_input_chars.inc(len(req.text))
            self.metrics.est_hit_rate.set(self.est_cached_chars / self.est_input_chars)
        return w, held

    def undo_insert(self, req: RoutingRequest, w: Worker, held: int) -> None:
        """The attempt on `w` failed before the worker could cache anything: withdraw the optimistic insert
        beyond what it held before, so a retry elsewhere leaves no phantom affinity behind."""
        if held < len(req.text):
            self.tree.remove_prefix(req.text[: held + 1], w.url)

    def worker_failed(self, w: Worker, failure: Failure) -> None:
        """An attempt on `w` failed: counts it, and passes the failure's verdict on to the worker's health."""
        self.metrics.worker_errors.labels(w.url).inc()
        if failure.effect in (Effect.EJECT, Effect.REFUSED):
            if self.registry.eject(w, failure.message, refused=failure.effect is Effect.REFUSED):
                self.metrics.ejections.labels(w.url).inc()
        elif failure.effect is Effect.COUNT:
            w.breaker.record(False)

    def observe_response(self, w: Worker, req: RoutingRequest, held: int, usage: Usage | None) -> None:
        """A response from `w` finished; `usage` is what the worker reported hitting its cache (if it did)."""
        if usage is not None:
            self.feedback.observe_response(w.url, req.text, held, usage)

    def estimated_hit_rate(self) -> float:
        return self.est_cached_chars / self.est_input_chars if self.est_input_chars else 0.0

    def describe_workers(self) -> list[dict]:
        return [{**w.describe(), "tree_chars": self.tree.char_count.get(w.url, 0)}
                for w in self.registry.workers.values()]

    # ---- background tasks --------------------------------------------------------------------------
    def evict(self) -> dict[str, int]:
        evicted = self.tree.evict_tenant_by_size(self.args.max_tree_size)
        if evicted:
            logger.debug("tree eviction: %s", evicted)
        return evicted

    async def poll_cache_state(self, w: Worker) -> None:
        try:
            r = await self.client.get(w.url + "/cache_state", timeout=self.args.health_check_timeout_secs)
            state = CacheState.parse(r.json()) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as e:
            logger.debug("cache state of %s unavailable: %r", w.url, e)
            state = None
        if state is None:
            self.feedback.stats.poll_errors += 1
        elif self.registry.workers.get(w.url) is w:  # it may have been removed while we waited
            action = self.feedback.observe_state(w.url, state)
            if action in ("clear", "shrink"):
                logger.info("cache feedback from %s: %s", w.url, action)

    async def run_cache_feedback(self) -> None:
        while True:
            await asyncio.gather(*(self.poll_cache_state(w) for w in list(self.registry.workers.values())
                                   if w.healthy))
            await asyncio.sleep(self.args.cache_feedback_interval)

    async def run_eviction(self) -> None:
        while True:
            await asyncio.sleep(self.args.eviction_interval)
            self.evict()
