"""The HTTP routes that report load: /metrics (Prometheus, the accumulator is radixlm.runtime.metrics), /v1/loads
and /cache_state (what a router balances on and keeps its picture of this worker's cache with)."""
from __future__ import annotations

import asyncio
import logging
import time

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

import radixlm
from radixlm.runtime.server.errors import error_response, flavor_of

logger = logging.getLogger(__name__)

router = APIRouter()

SCRAPE_STATE_TIMEOUT_S = 5.0


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
