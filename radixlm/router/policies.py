"""Load-balancing policies. Each picks one of the eligible workers (healthy, circuit not open) it is given;
the Router inserts the request text into the shared tree for whichever worker is picked."""
from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
import random
from dataclasses import dataclass
from typing import Protocol

from radixlm.router.tree import ApproxRadixTree
from radixlm.router.workers import Worker

logger = logging.getLogger(__name__)

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "prefix_hash", "consistent_hash")
POLICY_ALIASES = {"consistent_hashing": "consistent_hash"}


@dataclass(frozen=True)
class RoutingRequest:
    text: str  # what the request's prompt / messages / input_ids turn into (see request_text.py)
    routing_key: str | None = None  # X-SMG-Routing-Key header or the body's routing_key


class Policy(Protocol):
    name: str

    def select(self, workers: list[Worker], req: RoutingRequest) -> Worker: ...


def least_loaded(workers: list[Worker], tree: ApproxRadixTree | None = None) -> Worker:
    """Fewest in-flight requests; ties go to the smallest tree (most free cache), then registration order."""
    def key(w: Worker) -> tuple[int, int]:
        return w.in_flight, (tree.char_count.get(w.url, 0) if tree is not None else 0)
    return min(workers, key=key)


@dataclass(frozen=True)
class CacheAwareConfig:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5


def is_imbalanced(loads: list[int], cfg: CacheAwareConfig) -> bool:
    """Both the absolute gap AND the ratio must be exceeded: small gaps at low traffic and proportionally
    small gaps at high traffic both stay in cache-affinity mode."""
    hi, lo = max(loads), min(loads)
    return hi - lo > cfg.balance_abs_threshold and hi > lo * cfg.balance_rel_threshold


class CacheAwarePolicy:
    name = "cache_aware"

    def __init__(self, tree: ApproxRadixTree, config: CacheAwareConfig = CacheAwareConfig()) -> None:
        self.tree, self.config = tree, config
        self.last_mode = ""  # "imbalanced" | "cache_hit" | "min_load": for tests and debug logs

    def select(self, workers: list[Worker], req: RoutingRequest) -> Worker:
        if is_imbalanced([w.in_flight for w in workers], self.config):
            self.last_mode = "imbalanced"
            logger.debug("load imbalanced %s: routing to the least loaded",
                         {w.url: w.in_flight for w in workers})
            return least_loaded(workers, self.tree)
        match = self.tree.prefix_match(req.text, allowed={w.url for w in workers})
        if match.match_rate > self.config.cache_threshold and match.tenants:
            self.last_mode = "cache_hit"
            owners = [w for w in workers if w.url in match.tenants]
            # Several workers may hold the prefix: the least loaded of them, not an arbitrary one.
            return least_loaded(owners, self.tree)
        self.last_mode = "min_load"
        return least_loaded(workers, self.tree)


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def select(self, workers: list[Worker], req: RoutingRequest) -> Worker:
        return workers[next(self._counter) % len(workers)]


class RandomPolicy:
    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def select(self, workers: list[Worker], req: RoutingRequest) -> Worker:
        return self.rng.choice(workers)


class PowerOfTwoPolicy:
    name = "power_of_two"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def select(self, workers: list[Worker], req: RoutingRequest) -> Worker:
        if len(workers) == 1:
            return workers[0]
        a, b = self.rng.sample(workers, 2)
        return a if a.in_flight <= b.in_flight else b


def _hash(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing with virtual nodes: removing a worker moves only the keys it owned."""

    def __init__(self, urls: list[str], vnodes: int = 64) -> None:
        self.points = sorted((_hash(f"{u}#{i}"), u) for u in urls for i in range(vnodes))
        self._keys = [p for p, _ in self.points]

    def walk(self, key: str):
        """The ring's workers in order starting at the key's position (each once)."""
        start, seen = bisect.bisect(self._keys, _hash(key)), set()
        for i in range(len(self.points)):
            url = self.points[(start + i) % len(self.points)][1]
            if url not in seen:
                seen.add(url)
                yield url


class ConsistentHashPolicy:
    """Sticky by routing key (falls back to the whole text): the same session lands on the same worker."""
    name = "consistent_hash"

    def select(self, workers: list[Worker], req: RoutingRequest) -> Worker:
        by_url = {w.url: w for w in workers}
        return by_url[next(HashRing(list(by_url)).walk(req.routing_key or req.text))]


class PrefixHashPolicy:
    """Stateless cousin of cache_aware: hashes the first `prefix_chars` characters onto a ring, and walks on
    past workers whose load exceeds `load_factor` x the mean (bounded-load consistent hashing)."""
    name = "prefix_hash"

    def __init__(self, prefix_chars: int = 1024, load_factor: float = 1.25) -> None:
        self.prefix_chars, self.load_factor = prefix_chars, load_factor

    def select(self, workers: list[Worker], req: RoutingRequest) -> Worker:
        by_url = {w.url: w for w in workers}
        cap = self.load_factor * (sum(w.in_flight for w in workers) + 1) / len(workers)
        order = [by_url[u] for u in HashRing(list(by_url)).walk(req.text[: self.prefix_chars])]
        return next((w for w in order if w.in_flight + 1 <= cap), order[0])


def make_policy(name: str, tree: ApproxRadixTree, cache: CacheAwareConfig, seed: int | None = None,
                prefix_chars: int = 1024, load_factor: float = 1.25) -> Policy:
    name = POLICY_ALIASES.get(name, name)
    rng = random.Random(seed)
    if name == "cache_aware":
        return CacheAwarePolicy(tree, cache)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "random":
        return RandomPolicy(rng)
    if name == "power_of_two":
        return PowerOfTwoPolicy(rng)
    if name == "prefix_hash":
        return PrefixHashPolicy(prefix_chars, load_factor)
    if name == "consistent_hash":
        return ConsistentHashPolicy()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
