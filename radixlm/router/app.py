"""The router's HTTP face: a streaming proxy for the generation endpoints plus admin endpoints.

NOTE retry rule: an attempt may move to another worker only while nothing has been sent to the client.
Non-streamed responses are read whole before answering, so any worker failure is retryable; a streamed one
is committed once its first chunk arrives, after which a failure ends the stream with an error event."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable
from urllib.parse import unquote

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

import radixlm
from radixlm.router.args import RouterArgs
from radixlm.router.core import Router
from radixlm.router.policies import RoutingRequest
from radixlm.router.request_text import routing_text
from radixlm.router.usage import SseUsageScanner, usage_of_body
from radixlm.router.workers import LoadGuard, Worker

logger = logging.getLogger(__name__)

GENERATION_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/messages")
PASS_ROUTES = ("/tokenize", "/detokenize", "/v1/messages/count_tokens")
RETRY_STATUSES = {502, 503, 504}  # the worker is unavailable or overloaded: another one may serve it
DROP_REQUEST_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding"}
DROP_RESPONSE_HEADERS = {"content-length", "connection", "keep-alive", "transfer-encoding", "date", "server"}
CONNECT_TIMEOUT_S = 5.0
WORKER_HEADER = "x-radixlm-worker"  # which worker served a proxied response (debugging, tests)


def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status_code, media_type="application/json")


def error_response(message: str, status_code: int, err_type: str) -> Response:
    # The OpenAI error shape the workers use.
    return json_response({"object": "error", "message": message, "type": err_type, "param": None,
                          "code": status_code}, status_code)


def _headers(headers: httpx.Headers | Any, drop: set[str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in drop}


class Proxy:
    def __init__(self, router: Router) -> None:
        self.router = router

    def _failed(self, w: Worker, guard: LoadGuard, req: RoutingRequest, held: int, why: str) -> None:
        guard.release()
        w.breaker.record(False)
        self.router.undo_insert(req, w, held)
        self.router.metrics.worker_errors.labels(w.url).inc()
        logger.warning("attempt on %s failed before any byte reached the client: %s", w.url, why)

    async def forward(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as e:
            return self._count(path, error_response(f"request body is not valid JSON: {e}", 400, "BadRequestError"))
        if not isinstance(body, dict):
            return self._count(path, error_response("request body must be a JSON object", 400, "BadRequestError"))
        key = request.headers.get("x-smg-routing-key") or body.get("routing_key")
        req = RoutingRequest(routing_text(path, body), key if isinstance(key, str) else None)
        streaming = bool(body.get("stream"))
        headers = _headers(request.headers, DROP_REQUEST_HEADERS)
        args = self.router.args
        attempts = 1 if args.disable_retries else 1 + args.retry_max_retries
        timeout = httpx.Timeout(args.request_timeout_secs, connect=CONNECT_TIMEOUT_S)
        tried: set[str] = set()
        last: Response | None = None
        for attempt in range(attempts):
            picked = self.router.select(req, tried)
            if picked is None:
                break
            w, held = picked
            if attempt:
                self.router.metrics.retries.labels(w.url).inc()
            tried.add(w.url)
            guard = LoadGuard(w)
            try:
                upstream = await self.router.client.send(
                    self.router.client.build_request("POST", w.url + path, content=raw, headers=headers,
                                                     timeout=timeout), stream=True)
            except httpx.HTTPError as e:
                self._failed(w, guard, req, held, repr(e))
                continue
            out_headers = {**_headers(upstream.headers, DROP_RESPONSE_HEADERS), WORKER_HEADER: w.url}
            is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
            if upstream.status_code in RETRY_STATUSES or not (streaming and is_sse):
                try:
                    content = await upstream.aread()
                except httpx.HTTPError as e:
                    self._failed(w, guard, req, held, repr(e))
                    continue
                finally:
                    await upstream.aclose()
                resp = Response(content, upstream.status_code, out_headers)
                if upstream.status_code in RETRY_STATUSES:
                    self._failed(w, guard, req, held, f"HTTP {upstream.status_code}")
                    last = resp
                    continue
                guard.release()
                w.breaker.record(upstream.status_code < 500)
                if upstream.status_code == 200:
                    self.router.observe_response(w, req, held, usage_of_body(content))
                return self._count(path, resp)
            chunks = upstream.aiter_raw()
            try:
                first = await anext(chunks, b"")
            except httpx.HTTPError as e:
                await upstream.aclose()
                self._failed(w, guard, req, held, repr(e))
                continue
            self._count(path, upstream.status_code)
            relay = self._relay(first, chunks, upstream, guard, w, req, held)
            return StreamingResponse(relay, upstream.status_code, out_headers)
        if last is not None:
            return self._count(path, last)
        if tried:
            return self._count(path, error_response(
                f"all {len(tried)} workers tried failed before responding", 502, "BadGatewayError"))
        return self._count(path, error_response("no healthy worker available", 503, "ServiceUnavailableError"))

    async def _relay(self, first: bytes, chunks: AsyncIterator[bytes], upstream: httpx.Response,
                     guard: LoadGuard, w: Worker, req: RoutingRequest, held: int) -> AsyncIterator[bytes]:
        worker_failed = False
        completed = False
        # Chunks are scanned after they were handed on: the usage numbers never delay forwarding.
        scanner = SseUsageScanner() if upstream.status_code == 200 else None
        try:
            if first:
                yield first
                if scanner is not None:
                    scanner.feed(first)
            async for chunk in chunks:
                yield chunk
                if scanner is not None:
                    scanner.feed(chunk)
            completed = True
        except httpx.HTTPError as e:
            # Bytes already reached the client: no retry is possible, so end the stream with an error.
            worker_failed = True
            logger.warning("stream from %s broke after its first byte: %r", w.url, e)
            err = {"object": "error", "message": f"worker {w.url} failed mid-stream", "type": "BadGatewayError",
                   "param": None, "code": 502}
            yield b"data: " + orjson.dumps({"error": err}) + b"\n\n"
        finally:
            guard.release()  # load is held until the stream ends (or the client goes away)
            await upstream.aclose()
            if worker_failed:
                w.breaker.record(False)
                self.router.metrics.worker_errors.labels(w.url).inc()
            else:
                w.breaker.record(True)
            if completed and scanner is not None:
                self.router.observe_response(w, req, held, scanner.result())

    def _count(self, route: str, resp: Response | int) -> Response:
        status = resp if isinstance(resp, int) else resp.status_code
        self.router.metrics.requests.labels(route, str(status)).inc()
        return resp  # type: ignore[return-value]


async def _fan_out(router: Router, method: str, path: str, body: bytes | None = None,
                   healthy_only: bool = True) -> dict[str, httpx.Response | Exception]:
    workers = [w for w in router.registry.workers.values() if w.healthy or not healthy_only]

    async def one(w: Worker) -> httpx.Response | Exception:
        try:
            return await router.client.request(method, w.url + path, content=body,
                                               headers={"content-type": "application/json"},
                                               timeout=router.args.health_check_timeout_secs * 4)
        except httpx.HTTPError as e:
            return e
    results = await asyncio.gather(*(one(w) for w in workers))
    return {w.url: r for w, r in zip(workers, results)}


def create_app(args: RouterArgs, transport: httpx.AsyncBaseTransport | None = None,
               on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """`on_shutdown` runs (in a thread) when the server stops: `serve --dp-size` stops its workers there,
    because uvicorn re-raises SIGTERM after its shutdown and code after `run()` never runs."""
    client = httpx.AsyncClient(transport=transport, limits=httpx.Limits(max_connections=1024,
                                                                        max_keepalive_connections=256))
    router = Router(args, client)
    proxy = Proxy(router)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.registry.check_all(first=True)
        tasks = [asyncio.create_task(router.registry.run_health_checks()), asyncio.create_task(router.run_eviction())]
        if args.cache_feedback:
            tasks.append(asyncio.create_task(router.run_cache_feedback()))
        yield
        for t in tasks:
            t.cancel()
        await client.aclose()
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)

    app = FastAPI(lifespan=lifespan, title="radixlm router")
    app.state.router = router

    for route in GENERATION_ROUTES + PASS_ROUTES:
        async def handler(request: Request, _route: str = route) -> Response:
            return await proxy.forward(request, _route)
        app.add_api_route(route, handler, methods=["POST"])

    @app.get("/liveness")
    async def liveness() -> Response:
        return json_response({"status": "alive"})

    @app.get("/health")
    @app.get("/readiness")
    async def health() -> Response:
        workers = router.describe_workers()
        healthy = sum(w["healthy"] for w in workers)
        status = 200 if healthy else 503
        return json_response({"status": "healthy" if healthy else "unhealthy", "healthy_workers": healthy,
                              "total_workers": len(workers), "workers": workers}, status)

    @app.get("/health_generate")
    @app.get("/model_info")
    @app.get("/get_model_info")
    async def first_worker_get(request: Request) -> Response:
        for w in router.registry.eligible():
            try:
                r = await client.get(w.url + request.url.path, timeout=args.request_timeout_secs)
            except httpx.HTTPError:
                w.breaker.record(False)
                continue
            return Response(r.content, r.status_code, _headers(r.headers, DROP_RESPONSE_HEADERS))
        return error_response("no healthy worker available", 503, "ServiceUnavailableError")

    @app.get("/v1/models")
    async def models() -> Response:
        seen: dict[str, dict] = {}
        for r in (await _fan_out(router, "GET", "/v1/models")).values():
            if isinstance(r, httpx.Response) and r.status_code == 200:
                for m in r.json().get("data", []):
                    seen.setdefault(m.get("id"), m)
        if not seen:
            return error_response("no healthy worker available", 503, "ServiceUnavailableError")
        return json_response({"object": "list", "data": list(seen.values())})

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        return json_response({"router": dataclasses.asdict(args), "version": radixlm.__version__,
                              "workers": router.describe_workers(),
                              "estimated_cache_hit_rate": router.estimated_hit_rate()})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        noted = [w.url for w in router.registry.workers.values() if w.healthy]
        for url in noted:
            router.feedback.note_router_flush(url)
        results = await _fan_out(router, "POST", "/flush_cache")
        failed = {}
        for url in noted:
            r = results.get(url)
            if not (isinstance(r, httpx.Response) and r.status_code == 200):
                router.feedback.note_router_flush(url, -1)
        for url, r in results.items():
            if isinstance(r, httpx.Response) and r.status_code == 200:
                router.tree.clear_tenant(url)  # the worker's cache is empty now; so is our belief about it
            else:
                failed[url] = r.text.strip() if isinstance(r, httpx.Response) else repr(r)
        if failed or not results:
            msg = "no healthy worker to flush" if not results else f"cache not flushed on {failed}"
            return error_response(msg, 400, "BadRequestError")
        return json_response({"status": "flushed", "workers": list(results)})

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        results = await _fan_out(router, "POST", "/abort_request", await request.body())
        return json_response({url: (r.json() if isinstance(r, httpx.Response) and r.status_code == 200
                                    else {"error": r.text if isinstance(r, httpx.Response) else repr(r)})
                              for url, r in results.items()})

    @app.get("/v1/loads")
    @app.get("/get_loads")
    async def loads() -> Response:
        results = await _fan_out(router, "GET", "/v1/loads")
        out = []
        for w in router.registry.workers.values():
            r = results.get(w.url)
            reported = r.json().get("loads", []) if isinstance(r, httpx.Response) and r.status_code == 200 else []
            out.append({"worker": w.url, "healthy": w.healthy, "router_in_flight": w.in_flight, "loads": reported})
        return json_response({"workers": out})

    @app.get("/cache_feedback")
    async def cache_feedback() -> Response:
        """The router's estimated hit rate next to the workers' reported one, and the corrections made."""
        est = router.estimated_hit_rate()
        reported = router.feedback.reported_hit_rate()
        return json_response({**router.feedback.describe(), "estimated_cache_hit_rate": est,
                              "estimated_cached_chars": router.est_cached_chars,
                              "estimated_input_chars": router.est_input_chars,
                              "hit_rate_gap": abs(est - reported), "decisions": router.decisions,
                              "tree_chars": dict(router.tree.char_count)})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = router.metrics.render(list(router.registry.workers.values()), router.tree.char_count)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    _install_worker_routes(app, router)
    return app


def _install_worker_routes(app: FastAPI, router: Router) -> None:
    def add(url: Any) -> Response:
        if not isinstance(url, str):
            return error_response("give the worker as {\"url\": \"http://host:port\"}", 400, "BadRequestError")
        try:
            w = router.registry.add(url)
        except ValueError as e:
            return error_response(str(e), 409 if "already" in str(e) else 400, "BadRequestError")
        # The first check decides at once; until then the worker gets no traffic.
        asyncio.get_running_loop().create_task(router.registry.check(w, first=True))
        return json_response({"status": "accepted", "worker_id": w.url}, 202)

    def remove(url: str) -> Response:
        try:
            w = router.registry.remove(url)
        except (KeyError, ValueError) as e:
            return error_response(str(e).strip("'\""), 404, "NotFoundError")
        return json_response({"status": "removed", "worker_id": w.url})

    def worker_id(raw: str) -> str:
        raw = unquote(raw)
        # Some clients collapse "//" in paths: accept http:/host too.
        for scheme in ("http:/", "https:/"):
            if raw.startswith(scheme) and not raw.startswith(scheme + "/"):
                raw = scheme + "/" + raw[len(scheme):]
        return raw

    @app.get("/workers")
    async def list_workers() -> Response:
        return json_response({"workers": router.describe_workers(), "total": len(router.registry.workers)})

    @app.post("/workers")
    async def add_worker(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return error_response("request body is not valid JSON", 400, "BadRequestError")
        return add(body.get("url") if isinstance(body, dict) else None)

    @app.get("/workers/{wid:path}")
    async def get_worker(wid: str) -> Response:
        url = worker_id(wid)
        for w in router.describe_workers():
            if w["url"] == url.rstrip("/"):
                return json_response(w)
        return error_response(f"no worker {url}", 404, "NotFoundError")

    @app.delete("/workers/{wid:path}")
    async def delete_worker(wid: str) -> Response:
        return remove(worker_id(wid))

    @app.post("/add_worker")
    async def add_worker_legacy(url: str) -> Response:
        return add(url)

    @app.post("/remove_worker")
    async def remove_worker_legacy(url: str) -> Response:
        return remove(url)
