"""Prometheus metrics: one CollectorRegistry per TokenizerManager (never the global one, so several
servers can live in one process). Counters and histograms are fed by the TokenizerManager as outputs
arrive; the gauges are refreshed from the scheduler's internal state at scrape time."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

import radixlm
from radixlm.runtime.server.errors import error_response, flavor_of

logger = logging.getLogger(__name__)

router = APIRouter()

PREFIX = "radixlm:"
SCRAPE_STATE_TIMEOUT_S = 5.0
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

    def render(self) -> bytes:
        return generate_latest(self.registry)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    try:
        tm.metrics.set_state(await tm.get_internal_state(timeout=SCRAPE_STATE_TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 - a scrape still returns the counters when the runtime is down
        logger.warning("metrics: scheduler state unavailable (%r); gauges are stale", e)
    return Response(tm.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def _state_or_none(tm) -> dict | None:
    """The scheduler's state, or None when it does not answer in time (a busy or stalled scheduler)."""
    try:
        return await tm.get_internal_state(timeout=SCRAPE_STATE_TIMEOUT_S, allow_stale=True)
    except asyncio.TimeoutError:
        return None


def _busy(request: Request) -> Response:
    return error_response("the scheduler did not report its state in time", 503, flavor_of(request.url.path))


@router.get("/v1/loads")
async def loads(request: Request) -> Response:
    """The load a router balances on: requests running and queued, KV tokens in use (one entry per data-parallel
    rank; this server is one rank)."""
    tm = request.app.state.tokenizer_manager
    state = await _state_or_none(tm)
    if state is None:
        return _busy(request)
    total = state["max_total_num_tokens"]
    used = total - state["available_tokens"] - state["evictable_tokens"]
    stats = state["stats"]
    load = {
        "dp_rank": 0, "num_running_reqs": state["num_running_reqs"], "num_waiting_reqs": state["num_waiting_reqs"],
        "num_in_flight_reqs": tm.in_flight(), "num_used_tokens": used, "max_total_num_tokens": total,
        "token_usage": used / max(1, total), "cached_tokens_total": stats.get("cached_tokens", 0),
        "prompt_tokens_total": stats.get("prompt_tokens", 0),
    }
    return Response(orjson.dumps({"timestamp": time.time(), "version": radixlm.__version__, "loads": [load]}),
                    media_type="application/json")


@router.get("/cache_state")
async def cache_state(request: Request) -> Response:
    """What a router needs to keep its picture of this worker's radix cache honest: `instance_id` changes when the
    server restarts and `flush_count` when its cache is flushed (both empty the cache); `evicted_tokens_total`
    grows with evictions; `cached_tokens` is what the tree holds now."""
    tm = request.app.state.tokenizer_manager
    state = await _state_or_none(tm)
    if state is None:
        return _busy(request)
    return Response(orjson.dumps({
        "instance_id": tm.instance_id, "flush_count": state["stats"].get("flushes", 0),
        "evicted_tokens_total": state["evicted_tokens_total"],
        "cached_tokens": state["evictable_tokens"] + state["protected_tokens"],
        "max_total_num_tokens": state["max_total_num_tokens"],
    }), media_type="application/json")
