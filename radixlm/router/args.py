"""RouterArgs: one typed dataclass; the `radixlm router` flags are generated from it (names and defaults as
SGLang's router: the CLI defaults the guide lists)."""
from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from radixlm.router.policies import POLICIES, POLICY_ALIASES


class RouterSection(enum.Enum):
    """The heading a router flag appears under in `--help` and docs/router_args.md."""
    SERVER = "Router server"
    POLICY = "Routing policy"
    FEEDBACK = "Cache feedback"
    HEALTH = "Health checks"
    CIRCUIT = "Circuit breaker"
    RETRIES = "Retries"
    PD = "Prefill/decode disaggregation"


def arg(default: Any, section: RouterSection, help: str, *, choices: tuple[str, ...] | None = None,
        aliases: tuple[str, ...] = (), factory: Callable[[], Any] | None = None, nargs: str | None = None) -> Any:
    """nargs: a repeatable flag taking this many values each time (argparse's nargs; the field is a list of them)."""
    meta = {"section": section, "help": help, "choices": choices, "aliases": aliases, "nargs": nargs}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


SRV, POL, FB, HC = RouterSection.SERVER, RouterSection.POLICY, RouterSection.FEEDBACK, RouterSection.HEALTH
CB, RET, PD = RouterSection.CIRCUIT, RouterSection.RETRIES, RouterSection.PD


@dataclass
class RouterArgs:
    worker_urls: list[str] = arg(None, SRV, "workers to route to (more can be added at run time through /workers)",
                                 factory=list)
    host: str = arg("127.0.0.1", SRV, "address the router binds")
    port: int = arg(30000, SRV, "port the router listens on")
    request_timeout_secs: float = arg(1800.0, SRV, "seconds a worker may take to answer one request")
    log_level: str = arg("info", SRV, "logging level: debug, info, warning, error or critical")

    policy: str = arg("cache_aware", POL, "how a worker is picked for each request",
                      choices=POLICIES + tuple(POLICY_ALIASES))
    cache_threshold: float = arg(0.3, POL, "cache_aware: route to the longest-prefix worker when its match rate is "
                                           "above this")
    balance_abs_threshold: int = arg(64, POL, "cache_aware: the least busy worker is picked when the busiest has "
                                              "more than this many in-flight requests above it ...")
    balance_rel_threshold: float = arg(1.5, POL, "... and more than this times its in-flight requests")
    eviction_interval: float = arg(120.0, POL, "seconds between evictions from the router's prefix tree",
                                   aliases=("--eviction-interval-secs",))
    max_tree_size: int = arg(67108864, POL, "characters the prefix tree keeps per worker")
    prefix_token_count: int = arg(256, POL, "prefix_hash: hashes this many leading tokens (4 characters each, "
                                            "approximated on text)")
    prefix_hash_load_factor: float = arg(1.25, POL, "prefix_hash: passes over a worker whose load exceeds this "
                                                    "times the mean (bounded-load consistent hashing)")
    random_seed: int | None = arg(None, POL, "seeds the random and power_of_two policies; unset: a random seed")

    cache_feedback: bool = arg(False, FB, "correct the prefix tree from the workers' /cache_state and the "
                                          "cached_tokens their responses report")
    cache_feedback_interval: float = arg(1.0, FB, "seconds between /cache_state polls with --cache-feedback")

    health_failure_threshold: int = arg(3, HC, "consecutive failed checks that mark a healthy worker down")
    health_success_threshold: int = arg(2, HC, "consecutive passed checks that mark a down worker up")
    health_check_timeout_secs: float = arg(5.0, HC, "seconds one health check may take")
    health_check_interval_secs: float = arg(60.0, HC, "seconds between health checks of a healthy worker")
    health_check_endpoint: str = arg("/health", HC, "path the health checks request")

    cb_failure_threshold: int = arg(10, CB, "consecutive request failures that open a worker's circuit")
    cb_success_threshold: int = arg(3, CB, "consecutive successes, half-open, that close it again")
    cb_timeout_duration_secs: float = arg(60.0, CB, "seconds an open circuit refuses requests before letting "
                                                    "probes through")
    disable_circuit_breaker: bool = arg(False, CB, "never stop sending requests to a failing worker")

    retry_max_retries: int = arg(5, RET, "further workers tried for a request: always for one its worker never got "
                                         "(no connection, or HTTP 503), once for one a worker may have read when it died")
    retry_initial_backoff_ms: int = arg(50, RET, "delay before the first resend")
    retry_max_backoff_ms: int = arg(30000, RET, "cap on the delay between resends")
    retry_backoff_multiplier: float = arg(1.5, RET, "each further resend waits this many times longer")
    retry_jitter_factor: float = arg(0.2, RET, "delays vary at random by up to this fraction")
    disable_retries: bool = arg(False, RET, "send each request to one worker only")
    pd_disaggregation: bool = arg(False, PD, "route each generation request to a prefill worker and a decode worker "
                                             "(--prefill, --decode) with a bootstrap room; the decode worker answers")
    prefill: list[list[str]] = arg(None, PD, "a prefill worker: URL [BOOTSTRAP_PORT] (its "
                                             "--disaggregation-bootstrap-port; default 8998); repeat per worker",
                                   factory=list, nargs="+")
    decode: list[str] = arg(None, PD, "a decode worker's URL; repeat per worker", factory=list, nargs="1")
    prefill_policy: str | None = arg(None, PD, "picks the prefill worker (cache_aware keeps its own tree over the "
                                               "prefill pool); unset: --policy", choices=POLICIES + tuple(POLICY_ALIASES))
    decode_policy: str | None = arg(None, PD, "picks the decode worker; unset: --policy",
                                    choices=POLICIES + tuple(POLICY_ALIASES))
    quarantine_secs: float = arg(600.0, RET, "how long copies of a request that two workers died on are refused "
                                             "(HTTP 422) at the router")

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
            (0 <= self.retry_initial_backoff_ms <= self.retry_max_backoff_ms, "retry backoffs: 0 <= initial <= max"),
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
        self._check_pd()

    def _check_pd(self) -> None:
        if not self.pd_disaggregation:
            if self.prefill or self.decode:
                raise ValueError("--prefill and --decode need --pd-disaggregation")
            return
        if self.worker_urls:
            raise ValueError("--pd-disaggregation takes its workers from --prefill and --decode, not --worker-urls")
        if not self.prefill or not self.decode:
            raise ValueError("--pd-disaggregation needs at least one --prefill and one --decode worker")
        for entry in self.prefill:
            if not 1 <= len(entry) <= 2:
                raise ValueError(f"--prefill takes URL [BOOTSTRAP_PORT], got {' '.join(entry)!r}")
            if len(entry) == 2 and not (entry[1].isdigit() and 0 < int(entry[1]) < 65536):
                raise ValueError(f"--prefill {entry[0]}: the bootstrap port must be in [1, 65535], got {entry[1]!r}")
        for name in (self.prefill_policy, self.decode_policy):
            if name is not None and name not in POLICIES and name not in POLICY_ALIASES:
                raise ValueError(f"prefill/decode policy must be one of {', '.join(POLICIES)}")


def add_router_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    hints = typing.get_type_hints(RouterArgs)
    groups = {s: parser.add_argument_group(s.value) for s in RouterSection}
    for f in dataclasses.fields(RouterArgs):
        if f.name in skip:
            continue
        group = groups[f.metadata["section"]]
        flags = ["--" + f.name.replace("_", "-"), *f.metadata["aliases"]]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kw = {"default": default, "help": f.metadata["help"].replace("%", "%%"), "dest": f.name}
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if f.metadata.get("nargs"):
            n = f.metadata["nargs"]
            group.add_argument(*flags, action="append", nargs=None if n == "1" else n,
                               metavar=("URL", "[BOOTSTRAP_PORT]") if n == "+" else "URL", **kw)
        elif tp is bool:
            group.add_argument(*flags, action="store_true", **kw)
        elif typing.get_origin(tp) is list:
            group.add_argument(*flags, nargs="*", metavar="URL", **kw)
        else:
            choices = f.metadata["choices"]
            group.add_argument(*flags, type=tp, choices=choices, metavar=None if choices else tp.__name__.upper(),
                               **kw)


def router_args_from(ns: argparse.Namespace, **override) -> RouterArgs:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(RouterArgs) if hasattr(ns, f.name)}
    return RouterArgs(**{**values, **override})
