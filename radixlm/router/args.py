"""RouterArgs: one typed dataclass; the `radixlm router` flags are generated from it (names and defaults as
SGLang's router: the CLI defaults the guide lists)."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from radixlm.router.policies import POLICIES, POLICY_ALIASES


@dataclass
class RouterArgs:
    worker_urls: list[str] = field(default_factory=list, metadata={"help": "workers to route to (more can be added at run time via /workers)"})
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = field(default="cache_aware", metadata={"choices": POLICIES + tuple(POLICY_ALIASES)})
    cache_threshold: float = field(default=0.3, metadata={"help": "cache_aware: route to the longest-prefix worker above this match rate"})
    balance_abs_threshold: int = field(default=64, metadata={"help": "cache_aware: imbalanced when max-min in-flight exceeds this ..."})
    balance_rel_threshold: float = field(default=1.5, metadata={"help": "... and max exceeds this times min"})
    eviction_interval: float = field(default=120.0, metadata={"help": "seconds between tree evictions", "aliases": ("--eviction-interval-secs",)})
    max_tree_size: int = field(default=67108864, metadata={"help": "characters the tree keeps per worker"})
    prefix_token_count: int = field(default=256, metadata={"help": "prefix_hash: hashes this many tokens (4 characters each, approximated on text)"})
    prefix_hash_load_factor: float = 1.25
    random_seed: int | None = field(default=None, metadata={"help": "seeds random / power_of_two"})
    cache_feedback: bool = field(default=False, metadata={"help": "correct the tree from the workers' /cache_state (restarts, flushes, evictions) and from the cached_tokens their responses report"})
    cache_feedback_interval: float = field(default=1.0, metadata={"help": "seconds between /cache_state polls with --cache-feedback"})
    health_failure_threshold: int = 3
    health_success_threshold: int = 2
    health_check_timeout_secs: float = 5.0
    health_check_interval_secs: float = 60.0
    health_check_endpoint: str = "/health"
    cb_failure_threshold: int = 10
    cb_success_threshold: int = 3
    cb_timeout_duration_secs: float = 60.0
    disable_circuit_breaker: bool = False
    retry_max_retries: int = field(default=5, metadata={"help": "further workers tried for a request: always for one its worker never got (no connection, or HTTP 503), once for one a worker may have read when it died"})
    retry_initial_backoff_ms: int = field(default=50, metadata={"help": "delay before the first resend"})
    retry_max_backoff_ms: int = field(default=30000, metadata={"help": "cap on the delay between resends"})
    retry_backoff_multiplier: float = field(default=1.5, metadata={"help": "each further resend waits this many times longer"})
    retry_jitter_factor: float = field(default=0.2, metadata={"help": "delays vary at random by up to this fraction"})
    disable_retries: bool = False
    quarantine_secs: float = field(default=600.0, metadata={"help": "how long copies of a request that two workers died on are refused (HTTP 422) at the router"})
    request_timeout_secs: float = 1800.0
    log_level: str = "info"

    def __post_init__(self) -> None:
        checks = [
            (0.0 <= self.cache_threshold <= 1.0, "cache_threshold must be in [0, 1]"),
            (self.balance_abs_threshold >= 0, "balance_abs_threshold must be >= 0"),
            (self.balance_rel_threshold >= 1.0, "balance_rel_threshold must be >= 1"),
            (self.eviction_interval > 0, "eviction_interval must be > 0"),
            (self.max_tree_size >= 0, "max_tree_size must be >= 0"),
            (self.cache_feedback_interval > 0, "cache_feedback_interval must be > 0"),
            (self.health_failure_threshold >= 1 and self.health_success_threshold >= 1, "health thresholds must be >= 1"),
            (self.health_check_interval_secs > 0 and self.health_check_timeout_secs > 0, "health check times must be > 0"),
            (self.cb_failure_threshold >= 1 and self.cb_success_threshold >= 1, "circuit breaker thresholds must be >= 1"),
            (self.retry_max_retries >= 0, "retry_max_retries must be >= 0"),
            (0 <= self.retry_initial_backoff_ms <= self.retry_max_backoff_ms, "retry backoffs must be 0 <= initial <= max"),
            (self.retry_backoff_multiplier >= 1.0, "retry_backoff_multiplier must be >= 1"),
            (0.0 <= self.retry_jitter_factor <= 1.0, "retry_jitter_factor must be in [0, 1]"),
            (self.quarantine_secs > 0, "quarantine_secs must be > 0"),
            (self.request_timeout_secs > 0, "request_timeout_secs must be > 0"),
            (self.policy in POLICIES or self.policy in POLICY_ALIASES, f"policy must be one of {', '.join(POLICIES)}"),
            (self.prefix_token_count >= 1 and self.prefix_hash_load_factor >= 1.0, "prefix_hash settings out of range"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


def add_router_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    for f in dataclasses.fields(RouterArgs):
        if f.name in skip:
            continue
        flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ())]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kw = {"default": default, "help": f.metadata.get("help", ""), "dest": f.name}
        tp = f.type if isinstance(f.type, str) else f.type.__name__
        if tp == "bool":
            parser.add_argument(*flags, action="store_true", **kw)
        elif tp.startswith("list"):
            parser.add_argument(*flags, nargs="*", **kw)
        else:
            conv = {"int": int, "float": float, "str": str, "int | None": int}[tp]
            parser.add_argument(*flags, type=conv, choices=f.metadata.get("choices"), **kw)


def router_args_from(ns: argparse.Namespace, **override) -> RouterArgs:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(RouterArgs) if hasattr(ns, f.name)}
    return RouterArgs(**{**values, **override})
