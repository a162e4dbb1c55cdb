"""Prometheus metrics of one server: one CollectorRegistry per TokenizerManager (never the global one, so several
servers can live in one process). Counters and histograms are fed by the TokenizerManager as outputs arrive; the
gauges are refreshed from the scheduler's internal state when /metrics is scraped (server/metrics.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "radixlm:"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class ReqTiming:
    """Per-request timestamps kept by the TokenizerManager (time.perf_counter seconds)."""

    created: float
    # Only streamed requests get an output per step; a non-streamed one gets its tokens at the end,
    # so TTFT and inter-token latency are observed for streamed requests only.
    stream: bool
    last_token: float | None = None  # None until the first output token arrives
    queue_observed: bool = False


@dataclass
class ServerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Generated tokens", registry=r)
        self.num_requests = Counter(PREFIX + "num_requests", "Finished requests (any finish reason)", registry=r)
        self.cached_tokens = Counter(PREFIX + "cached_tokens", "Prompt tokens served from the radix cache", registry=r)
        self.num_running_reqs = Gauge(PREFIX + "num_running_reqs", "Requests in the running batch", registry=r)
        self.num_queue_reqs = Gauge(PREFIX + "num_queue_reqs", "Requests waiting in the scheduler", registry=r)
        self.token_usage = Gauge(PREFIX + "token_usage", "Share of KV slots held by requests (not free, not evictable)", registry=r)
        self.cache_hit_rate = Gauge(PREFIX + "cache_hit_rate", "Cached prompt tokens / prompt tokens since start", registry=r)
        self.spec_draft_tokens = Gauge(PREFIX + "spec_draft_tokens", "Draft tokens verified since start", registry=r)
        self.spec_accepted_tokens = Gauge(PREFIX + "spec_accepted_tokens", "Draft tokens kept since start", registry=r)
        self.spec_accept_rate = Gauge(PREFIX + "spec_accept_rate", "Kept / verified draft tokens since start", registry=r)
        self.spec_verifications = Gauge(PREFIX + "spec_verifications", "Drafts verified since start", registry=r)
        self.spec_accept_length = Gauge(PREFIX + "spec_accept_length",
                                        "Tokens a verified draft's pass yields on average (kept draft tokens + 1)",
                                        registry=r)
        self.spec_controller_off_steps = Gauge(PREFIX + "spec_controller_off_steps",
                                               "Scheduler steps the draft controller kept drafting off since start",
                                               registry=r)
        self.num_retracted_reqs = Gauge(PREFIX + "num_retracted_reqs",
                                        "Running requests retracted because the KV pool ran out, since start",
                                        registry=r)
        self.num_preempted_reqs = Gauge(PREFIX + "num_preempted_reqs",
                                        "Running requests preempted by higher-priority ones, since start", registry=r)
        self.num_deadline_aborted_reqs = Gauge(PREFIX + "num_deadline_aborted_reqs",
                                               "Requests aborted past a waiting, running or own deadline, since start",
                                               registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Submit to first output token (streamed requests)", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds",
                             "Gap between outputs / tokens they carry (streamed requests)", buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Submit to finish", buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(PREFIX + "queue_time_seconds",
                                    "Scheduler arrival to first admission into a prefill batch", buckets=_LATENCY_BUCKETS, registry=r)

    def on_output(self, t: ReqTiming, now: float, new_tokens: int, queue_time: float | None) -> None:
        if queue_time is not None and not t.queue_observed:
            t.queue_observed = True
            self.queue_time.observe(queue_time)
        if new_tokens <= 0:
            return
        self.generation_tokens.inc(new_tokens)
        if not t.stream:
            return
        if t.last_token is None:
            self.ttft.observe(now - t.created)
        else:
            self.itl.observe((now - t.last_token) / new_tokens)
        t.last_token = now

    def on_finish(self, t: ReqTiming, now: float, prompt_tokens: int, cached_tokens: int) -> None:
        self.num_requests.inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.e2e.observe(now - t.created)

    def set_state(self, state: dict) -> None:
        total = max(1, state["max_total_num_tokens"])
        self.num_running_reqs.set(state["num_running_reqs"])
        self.num_queue_reqs.set(state["num_waiting_reqs"])
        self.token_usage.set((total - state["available_tokens"] - state["evictable_tokens"]) / total)
        stats = state.get("stats", {})
        prompt = stats.get("prompt_tokens", 0)
        self.cache_hit_rate.set(stats.get("cached_tokens", 0) / prompt if prompt else 0.0)
        drafted, kept = stats.get("draft_tokens", 0), stats.get("accepted_draft_tokens", 0)
        self.spec_draft_tokens.set(drafted)
        self.spec_accepted_tokens.set(kept)
        self.spec_accept_rate.set(kept / drafted if drafted else 0.0)
        verified = stats.get("draft_verifications", 0)
        self.spec_verifications.set(verified)
        self.spec_accept_length.set((kept + verified) / verified if verified else 0.0)
        self.spec_controller_off_steps.set(stats.get("spec_controller_off_steps", 0))
        self.num_retracted_reqs.set(stats.get("retractions", 0))
        self.num_preempted_reqs.set(stats.get("preemptions", 0))
        self.num_deadline_aborted_reqs.set(stats.get("deadline_aborts", 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
