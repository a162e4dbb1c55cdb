"""Router Prometheus metrics, in a registry of their own (never the global one: several routers, or a
router and a worker, may share a process). Per-worker gauges are refreshed at scrape time."""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from radixlm.router.workers import Worker

PREFIX = "radixlm_router:"


@dataclass
class RouterMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.selections = Counter(PREFIX + "worker_selection", "Times the policy chose a worker",
                                  ["worker", "policy"], registry=r)
        self.requests = Counter(PREFIX + "requests", "Proxied requests by route and final HTTP status",
                                ["route", "status"], registry=r)
        self.retries = Counter(PREFIX + "retries", "Attempts sent to a worker after an attempt on another one "
                               "failed (by kind: resends)", ["worker"], registry=r)
        self.resends = Counter(PREFIX + "resends", "Requests sent to another worker after a failed attempt, by "
                               "what the failed worker can have seen: not_sent (it never got the request), "
                               "maybe_read (it broke after the request was sent)", ["kind"], registry=r)
        self.quarantines = Counter(PREFIX + "quarantines", "Requests quarantined: a second worker broke while "
                                   "it had the request (or a copy of it)", registry=r)
        self.quarantine_refusals = Counter(PREFIX + "quarantine_refusals", "Copies of quarantined requests "
                                           "refused at the router", registry=r)
        self.quarantined = Gauge(PREFIX + "quarantined_requests", "Request fingerprints in quarantine now",
                                 registry=r)
        self.worker_errors = Counter(PREFIX + "worker_errors", "Failed attempts by worker", ["worker"], registry=r)
        self.ejections = Counter(PREFIX + "worker_ejections", "Times a healthy worker was marked down at once "
                                 "because it failed a request (passive health check)", ["worker"], registry=r)
        self.est_cached_chars = Counter(PREFIX + "estimated_cached_chars",
                                        "Request characters the tree believed the chosen worker held", registry=r)
        self.est_input_chars = Counter(PREFIX + "estimated_input_chars", "Request characters routed", registry=r)
        self.est_hit_rate = Gauge(PREFIX + "estimated_cache_hit_rate",
                                  "estimated_cached_chars / estimated_input_chars since start", registry=r)
        self.decisions = Counter(PREFIX + "routing_decisions", "cache_aware decisions by mode (cache_hit, "
                                 "min_load, imbalanced)", ["mode"], registry=r)
        self.reported_cached_tokens = Counter(PREFIX + "reported_cached_tokens", "Prompt tokens the workers "
                                              "reported as cache hits in proxied responses", registry=r)
        self.reported_prompt_tokens = Counter(PREFIX + "reported_prompt_tokens", "Prompt tokens of proxied "
                                              "responses, as the workers reported them", registry=r)
        self.reported_hit_rate = Gauge(PREFIX + "reported_cache_hit_rate", "reported_cached_tokens / "
                                       "reported_prompt_tokens since start", registry=r)
        self.feedback_corrections = Counter(PREFIX + "cache_feedback_corrections", "Tree corrections from worker "
                                            "cache feedback by kind (clear, shrink, phantom)", ["kind"], registry=r)
        self.feedback_chars = Counter(PREFIX + "cache_feedback_removed_chars", "Characters removed from the tree "
                                      "by cache feedback, by kind", ["kind"], registry=r)
        self.active = Gauge(PREFIX + "worker_requests_active", "In-flight requests per worker", ["worker"], registry=r)
        self.health = Gauge(PREFIX + "worker_health", "1 when the worker is marked healthy", ["worker"], registry=r)
        self.circuit = Gauge(PREFIX + "worker_circuit_state", "0 closed, 1 open, 2 half-open", ["worker"], registry=r)
        self.tree_chars = Gauge(PREFIX + "tree_chars", "Characters the tree attributes to each worker",
                                ["worker"], registry=r)

    def render(self, workers: list[Worker], tree_chars: dict[str, int], quarantined: int = 0) -> bytes:
        self.quarantined.set(quarantined)
        for g in (self.active, self.health, self.circuit, self.tree_chars):
            g.clear()  # removed workers must disappear from the gauges
        for w in workers:
            self.active.labels(w.url).set(w.in_flight)
            self.health.labels(w.url).set(1 if w.healthy else 0)
            self.circuit.labels(w.url).set(int(w.breaker.state))
            self.tree_chars.labels(w.url).set(tree_chars.get(w.url, 0))
        return generate_latest(self.registry)
