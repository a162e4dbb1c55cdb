"""The router's HTTP face: a streaming proxy for the generation endpoints (the admin endpoints are admin.py's).

NOTE retry rule, by what the failed worker can have seen of the request (failures.Delivery):
- NOT_SENT (no connection: refused, connect timeout, no free connection in the router's pool; the connection broke
  before the request was fully written; or the worker answered 503, alive and saying so): always sent to another
  worker, within --retry-max-retries.
- MAYBE_READ (the connection broke after the request was sent, before an answer): the worker may have read it and
  died of it, or died of something else. It is resent once, to one other worker; if that worker breaks too, the
  request is quarantined (quarantine.py): the client gets a 502 saying so, and copies of it are refused at the
  router (422) for --quarantine-secs. Every attempt with the same bytes after a death goes to that same one other
  worker, so one poison request takes down at most two workers.
- ANSWERED (the worker answered another 5xx, or did not answer within the request timeout): final; the client
  gets the worker's own 5xx, or a 504 in the route's error shape.
Resends wait SGLang's retry backoff. A worker that failed this way is ejected until the active health checks pass
it (failures.py, workers.py); --disable-retries sends every request to one worker only.
A stream is committed once its first chunk reached the client; a failure after that ends it with an error event."""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from radixlm.router.admin import install_admin_routes, json_response
from radixlm.router.args import RouterArgs
from radixlm.router.core import Router
from radixlm.router.failures import (Backoff, Delivery, Failure, failure_of_exception, failure_of_status,
                                    stream_error_event)
from radixlm.router.policies import RoutingRequest
from radixlm.router.quarantine import Verdict, fingerprint
from radixlm.router.request_text import routing_text
from radixlm.router.responses import (RESPONSES_ROUTE, ResponseOwners, SseResponseIdScanner, previous_id,
                                      response_id_of_body)
from radixlm.router.usage import SseUsageScanner, usage_of_body
from radixlm.router.workers import LoadGuard, Worker
from radixlm.runtime.server.errors import ApiFlavor, error_response, flavor_of

logger = logging.getLogger(__name__)

GENERATION_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/messages", RESPONSES_ROUTE)
PASS_ROUTES = ("/tokenize", "/detokenize", "/v1/messages/count_tokens")
# Embedding servers' routes (--is-embedding) and /v1/score: stateless, so any worker answers; routed like the others.
POOLING_ROUTES = ("/encode", "/v1/embeddings", "/v1/rerank", "/v1/score")
DROP_REQUEST_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding"}
DROP_RESPONSE_HEADERS = {"content-length", "connection", "keep-alive", "transfer-encoding", "date", "server"}
CONNECT_TIMEOUT_S = 5.0
# Below the workers' 5 s keep-alive, so the router never reuses a connection the worker is closing: a request
# lost that way would look like one its worker broke on (MAYBE_READ), and would eject a live worker.
KEEPALIVE_EXPIRY_S = 2.0
WORKER_HEADER = "x-radixlm-worker"  # which worker served (or failed) a proxied request (debugging, tests)
MAX_TRACKED_RESPONSES = 100_000  # response id -> worker entries kept (each worker's own store is smaller by default)


def _headers(headers: httpx.Headers | Any, drop: set[str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in drop}


def _pinned(urls: list[str], pin: str | None) -> list[str]:
    """Only the pinned worker while it is eligible; any worker otherwise (which then answers that it lacks the
    previous response)."""
    return [pin] if pin is not None and pin in urls else urls


@dataclass
class Call:
    """One client request on its way through the proxy (set by Proxy._call, except the last three)."""
    path: str
    flavor: ApiFlavor
    raw: bytes
    fp: bytes  # quarantine.fingerprint of path and raw
    headers: dict[str, str]
    streaming: bool
    req: RoutingRequest
    timeout: httpx.Timeout
    pin: str | None = None  # the one worker that can serve it (the worker storing its previous response), if known
    busy: Response | None = None  # a worker's 503 (set by _failed): the answer when no other worker takes it
    answer: Response | None = None  # a worker's own final failure answer, e.g. its 500 (set by _failed)
    deaths: list[tuple[str, Failure]] = field(default_factory=list)  # MAYBE_READ attempts: (worker, failure)


class Proxy:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.backoff = Backoff.of(router.args)
        self.owners = ResponseOwners(MAX_TRACKED_RESPONSES)

    async def forward(self, request: Request, path: str) -> Response:
        call = await self._call(request, path)
        if isinstance(call, Response):
            return self._count(path, call)
        q = self.router.quarantine
        if q.verdict(call.fp) is Verdict.QUARANTINED:
            return self._count(path, self._refused(call))
        args = self.router.args
        attempts = 1 if args.disable_retries else 1 + args.retry_max_retries
        tried: set[str] = set()
        failure: Failure | None = None
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(self.backoff.delay_s(attempt - 1))
            picked = self.router.select(call.req, tried, lambda urls: q.candidates(call.fp, _pinned(urls, call.pin)))
            if picked is None:
                break
            w, held = picked
            if failure is not None:
                self.router.metrics.retries.labels(w.url).inc()
                self.router.metrics.resends.labels(failure.delivery.value).inc()
            tried.add(w.url)
            tracked = q.sent(call.fp, w.url)
            try:
                result = await self._attempt(call, w, held)
            except BaseException:  # the client went away: the attempt counts for nothing
                q.untrack(call.fp, w.url, tracked)
                raise
            if isinstance(result, Response):
                q.ended(call.fp, w.url, tracked, None)
                return self._count(path, result)
            failure = result
            if q.ended(call.fp, w.url, tracked, failure.delivery):
                self.router.metrics.quarantines.inc()
            if failure.delivery is Delivery.ANSWERED:
                final = call.answer or self._error(f"{failure.message}; the request was not resent", failure.status,
                                                   call, w.url)
                return self._count(path, final)
            if failure.delivery is Delivery.MAYBE_READ:
                call.deaths.append((w.url, failure))
                if len(call.deaths) > 1:
                    break
        return self._count(path, self._unserved(call, tried, failure, attempts))

    async def _call(self, request: Request, path: str) -> Call | Response:
        flavor = flavor_of(path)
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as e:
            return error_response(f"request body is not valid JSON: {e}", 400, flavor)
        if not isinstance(body, dict):
            return error_response("request body must be a JSON object", 400, flavor)
        key = request.headers.get("x-smg-routing-key") or body.get("routing_key")
        pin = self.owners.owner(previous_id(body)) if path == RESPONSES_ROUTE else None
        return Call(path, flavor, raw, fingerprint(path, raw), _headers(request.headers, DROP_REQUEST_HEADERS),
                    bool(body.get("stream")),
                    RoutingRequest(routing_text(path, body), key if isinstance(key, str) else None),
                    httpx.Timeout(self.router.args.request_timeout_secs, connect=CONNECT_TIMEOUT_S), pin)

    async def _attempt(self, call: Call, w: Worker, held: int) -> Response | Failure:
        """One try on `w`. A Response is the worker's answer (a started stream included); a Failure is for
        forward() to judge (a worker's own failure answer is kept in `call`)."""
        guard = LoadGuard(w)
        client = self.router.client
        try:
            upstream = await client.send(client.build_request(
                "POST", w.url + call.path, content=call.raw, headers=call.headers, timeout=call.timeout), stream=True)
        except httpx.HTTPError as e:
            return self._failed(call, w, held, guard, failure_of_exception(e, w.url))
        out_headers = {**_headers(upstream.headers, DROP_RESPONSE_HEADERS), WORKER_HEADER: w.url}
        failure = failure_of_status(upstream.status_code, w.url)
        if failure is None and call.streaming and upstream.headers.get("content-type", "").startswith(
                "text/event-stream"):
            return await self._stream(call, w, held, guard, upstream, out_headers)
        try:
            content = await upstream.aread()
        except httpx.HTTPError as e:
            return self._failed(call, w, held, guard, failure_of_exception(e, w.url))
        finally:
            await upstream.aclose()
        answer = Response(content, upstream.status_code, out_headers)
        if failure is not None:
            return self._failed(call, w, held, guard, failure, answer)
        guard.release()
        w.breaker.record(True)
        if upstream.status_code == 200:
            self.router.observe_response(w, call.req, held, usage_of_body(content))
            if call.path == RESPONSES_ROUTE:
                self._owned(response_id_of_body(content), w)
        return answer

    def _owned(self, response_id: str | None, w: Worker) -> None:
        if response_id is not None:
            self.owners.record(response_id, w.url)

    async def _stream(self, call: Call, w: Worker, held: int, guard: LoadGuard, upstream: httpx.Response,
                      out_headers: dict[str, str]) -> Response | Failure:
        chunks = upstream.aiter_raw()
        try:
            # Until the first chunk nothing reached the client: a failure is judged like any other.
            first = await anext(chunks, b"")
        except httpx.HTTPError as e:
            await upstream.aclose()
            return self._failed(call, w, held, guard, failure_of_exception(e, w.url))
        relay = self._relay(call, first, chunks, upstream, guard, w, held)
        return StreamingResponse(relay, upstream.status_code, out_headers)

    def _failed(self, call: Call, w: Worker, held: int, guard: LoadGuard, failure: Failure,
                answer: Response | None = None) -> Failure:
        """Records a failed attempt; `answer` is the worker's own, if it answered."""
        guard.release()
        self.router.undo_insert(call.req, w, held)
        self.router.worker_failed(w, failure)
        logger.warning("%s %s", call.path, failure.message)
        if answer is not None:
            if failure.delivery is Delivery.NOT_SENT:
                call.busy = answer
            else:
                call.answer = answer
        return failure

    def _error(self, message: str, status: int, call: Call, worker: str | None = None) -> Response:
        resp = error_response(message, status, call.flavor)
        if worker is not None:
            resp.headers[WORKER_HEADER] = worker
        return resp

    def _refused(self, call: Call) -> Response:
        self.router.metrics.quarantine_refusals.inc()
        dead = self.router.quarantine.dead(call.fp)
        return self._error(f"request refused: it is quarantined, since workers {' and '.join(dead)} failed while "
                           f"handling it (or a copy of it); copies of it are refused for up to "
                           f"{self.router.args.quarantine_secs:g} s after the last failure", 422, call)

    def _unserved(self, call: Call, tried: set[str], failure: Failure | None, attempts: int) -> Response:
        """No worker served the request: the quarantine's answer, a worker's death, a worker's own 503 if one
        answered so, else the router's error."""
        if self.router.quarantine.verdict(call.fp) is Verdict.QUARANTINED:
            if not call.deaths:
                return self._refused(call)
            dead = self.router.quarantine.dead(call.fp)
            return self._error(f"two workers ({' and '.join(dead)}) failed while handling this request (or a copy "
                               f"of it; the last: {call.deaths[-1][1].message}); it may be what makes them fail, so it "
                               f"was not resent, and copies of it will be refused for "
                               f"{self.router.args.quarantine_secs:g} s", 502, call, dead[-1] if dead else None)
        if call.deaths:
            url, death = call.deaths[0]
            why = "retries are disabled" if attempts == 1 else (
                "no other worker could take it" if len(tried) < attempts else "out of retries")
            return self._error(f"{death.message}; the request was not resent ({why})", death.status, call, url)
        if call.busy is not None:
            return call.busy
        if failure is not None:
            return self._error(f"no worker accepted the request ({len(tried)} tried; the last: {failure.message})",
                               failure.status, call)
        return self._error("no healthy worker available", 503, call)

    async def _relay(self, call: Call, first: bytes, chunks: AsyncIterator[bytes], upstream: httpx.Response,
                     guard: LoadGuard, w: Worker, held: int) -> AsyncIterator[bytes]:
        failure: Failure | None = None
        completed = False
        # Chunks are scanned after they were handed on: the usage numbers never delay forwarding.
        scanner = SseUsageScanner() if upstream.status_code == 200 else None
        ids = SseResponseIdScanner() if scanner is not None and call.path == RESPONSES_ROUTE else None
        try:
            if first:
                yield first
                if scanner is not None:
                    scanner.feed(first)
                if ids is not None:
                    ids.feed(first)
            async for chunk in chunks:
                yield chunk
                if scanner is not None:
                    scanner.feed(chunk)
                if ids is not None:
                    ids.feed(chunk)
            completed = True
        except httpx.HTTPError as e:
            failure = failure_of_exception(e, w.url)
            # Recorded before the client hears of it, so /workers already shows the worker down.
            self.router.worker_failed(w, failure)
            if self.router.quarantine.ended(call.fp, w.url, False, failure.delivery):
                self.router.metrics.quarantines.inc()
            message = f"{failure.message}; the stream had begun, so the request was not resent"
            logger.warning("%s stream broke after its first byte: %s", call.path, message)
            yield stream_error_event(message, failure.status, call.flavor)
        finally:
            guard.release()  # load is held until the stream ends (or the client goes away)
            await upstream.aclose()
            if failure is None:
                w.breaker.record(True)
            if completed and scanner is not None:
                self.router.observe_response(w, call.req, held, scanner.result())
                if ids is not None:
                    self._owned(ids.response_id, w)

    def _count(self, route: str, resp: Response) -> Response:
        self.router.metrics.requests.labels(route, str(resp.status_code)).inc()
        return resp


def create_app(args: RouterArgs, transport: httpx.AsyncBaseTransport | None = None,
               on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """`on_shutdown` runs (in a thread) when the server stops: `serve --dp-size` stops its workers there,
    because uvicorn re-raises SIGTERM after its shutdown and code after `run()` never runs."""
    client = httpx.AsyncClient(transport=transport, limits=httpx.Limits(
        max_connections=1024, max_keepalive_connections=256, keepalive_expiry=KEEPALIVE_EXPIRY_S))
    if args.pd_disaggregation:
        from radixlm.router.pd import create_pd_app

        return create_pd_app(args, client, GENERATION_ROUTES, on_shutdown)
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

    for route in GENERATION_ROUTES + PASS_ROUTES + POOLING_ROUTES:
        async def handler(request: Request, _route: str = route) -> Response:
            return await proxy.forward(request, _route)
        app.add_api_route(route, handler, methods=["POST"])

    @app.get(RESPONSES_ROUTE + "/{response_id}")
    @app.delete(RESPONSES_ROUTE + "/{response_id}")
    async def stored_response(request: Request, response_id: str) -> Response:
        """The worker that made the response first, then the others (the router may have restarted since)."""
        owner = proxy.owners.owner(response_id)
        workers = sorted(router.registry.eligible(), key=lambda w: w.url != owner)
        for w in workers:
            try:
                r = await client.request(request.method, w.url + request.url.path,
                                         timeout=args.request_timeout_secs)
            except httpx.HTTPError as e:
                router.worker_failed(w, failure_of_exception(e, w.url))
                continue
            if r.status_code == 404:
                continue
            if request.method == "DELETE" and r.status_code == 200:
                proxy.owners.forget(response_id)
            elif r.status_code == 200:
                proxy.owners.record(response_id, w.url)
            headers = {**_headers(r.headers, DROP_RESPONSE_HEADERS), WORKER_HEADER: w.url}
            return Response(r.content, r.status_code, headers)
        return error_response(f"Response with id '{response_id}' not found.", 404, ApiFlavor.OPENAI)

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
            except httpx.HTTPError as e:
                router.worker_failed(w, failure_of_exception(e, w.url))
                continue  # a GET may go to the next worker whatever happened
            return Response(r.content, r.status_code, _headers(r.headers, DROP_RESPONSE_HEADERS))
        return error_response("no healthy worker available", 503)

    install_admin_routes(app, router)
    return app
