"""The router's PD mode (`radixlm router --pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL ...`):
each generation request goes to a prefill worker and a decode worker picked by independent policies over the two
pools (select_pd_pair; cache_aware keeps a tree per pool), both with the same bootstrap_host / bootstrap_port (the
prefill worker's bootstrap server) and a random bootstrap_room injected. The decode worker's answer (streamed or
not) is the client's; the prefill worker's is read and dropped, unless it fails first: then the decode request is
cancelled and the client gets the prefill worker's error. A client that goes away cancels both (each worker aborts
the request when its connection closes). Health checks and circuit breakers are per worker, in a registry per
pool; a failed request is not resent (its room would be taken)."""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import AsyncIterator
from urllib.parse import urlsplit

import httpx
import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixlm.router.args import RouterArgs
from radixlm.router.failures import stream_error_event
from radixlm.router.policies import CacheAwareConfig, RoutingRequest, make_policy
from radixlm.router.request_text import routing_text
from radixlm.router.tree import ApproxRadixTree
from radixlm.router.workers import CircuitConfig, HealthConfig, LoadGuard, Worker, WorkerRegistry, normalize_url
from radixlm.runtime.server.errors import error_response, flavor_of

logger = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default
DISCONNECT_POLL_S = 0.5
CONNECT_TIMEOUT_S = 5.0
DROP_REQUEST_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "accept-encoding"}
DROP_RESPONSE_HEADERS = {"content-length", "connection", "keep-alive", "transfer-encoding", "date", "server"}


@dataclass(frozen=True)
class PDPair:
    prefill: Worker
    decode: Worker
    bootstrap_host: str
    bootstrap_port: int
    bootstrap_room: int

    def inject(self, body: dict) -> dict:
        return {**body, "bootstrap_host": self.bootstrap_host, "bootstrap_port": self.bootstrap_port,
                "bootstrap_room": self.bootstrap_room}


class _Pool:
    """One pool's registry, tree and policy (the registry's listener keeps the tree's tenants)."""

    def __init__(self, args: RouterArgs, policy: str, client: httpx.AsyncClient, seed: int | None) -> None:
        self.tree = ApproxRadixTree()
        self.policy = make_policy(policy, self.tree, CacheAwareConfig(args.cache_threshold, args.balance_abs_threshold,
                                                                       args.balance_rel_threshold), seed=seed)
        self.registry = WorkerRegistry(
            HealthConfig(args.health_failure_threshold, args.health_success_threshold,
                         args.health_check_timeout_secs, args.health_check_interval_secs, args.health_check_endpoint),
            CircuitConfig(args.cb_failure_threshold, args.cb_success_threshold, args.cb_timeout_duration_secs,
                          enabled=not args.disable_circuit_breaker), client)
        self.registry.listeners.append(self)

    def worker_added(self, url: str) -> None:
        self.tree.add_tenant(url)

    def worker_removed(self, url: str) -> None:
        self.tree.remove_tenant(url)

    def worker_down(self, url: str) -> None:
        self.tree.clear_tenant(url)

    def select(self, req: RoutingRequest) -> Worker | None:
        candidates = self.registry.eligible()
        if not candidates:
            return None
        w = self.policy.select(candidates, req)
        w.selections += 1
        if req.text:
            self.tree.insert(req.text, w.url)
        return w


class PDRouter:
    def __init__(self, args: RouterArgs, client: httpx.AsyncClient) -> None:
        self.args, self.client = args, client
        seed = args.random_seed
        self.prefill = _Pool(args, args.prefill_policy or args.policy, client, seed)
        self.decode = _Pool(args, args.decode_policy or args.policy, client, None if seed is None else seed + 1)
        self.rng = random.Random(seed)
        self.bootstrap_ports: dict[str, int] = {}
        for entry in args.prefill:
            url = normalize_url(entry[0])
            self.prefill.registry.add(url)
            self.bootstrap_ports[url] = int(entry[1]) if len(entry) > 1 else DEFAULT_BOOTSTRAP_PORT
        for url in args.decode:
            self.decode.registry.add(url)

    def select_pd_pair(self, req: RoutingRequest) -> PDPair | None:
        """A prefill worker and a decode worker, each by its pool's policy; None when a pool has no eligible one."""
        p = self.prefill.select(req)
        d = self.decode.select(req) if p is not None else None
        if p is None or d is None:
            return None
        return PDPair(p, d, urlsplit(p.url).hostname or "127.0.0.1", self.bootstrap_ports[p.url],
                      self.rng.getrandbits(63))

    def describe_workers(self) -> list[dict]:
        return ([{**w.describe(), "role": "prefill", "bootstrap_port": self.bootstrap_ports[w.url]}
                 for w in self.prefill.registry.workers.values()]
                + [{**w.describe(), "role": "decode"} for w in self.decode.registry.workers.values()])

    async def check_all(self, first: bool = False) -> None:
        await asyncio.gather(self.prefill.registry.check_all(first=first), self.decode.registry.check_all(first=first))

    async def run_health_checks(self) -> None:
        await asyncio.gather(self.prefill.registry.run_health_checks(), self.decode.registry.run_health_checks())


def _headers(headers, drop: set[str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in drop}


class PDProxy:
    def __init__(self, router: PDRouter) -> None:
        self.router = router
        self._tasks: set[asyncio.Task] = set()  # prefill calls still running after their decode call ended

    def _keep(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def forward(self, request: Request, path: str) -> Response:
        flavor = flavor_of(path)
        try:
            body = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError as e:
            return error_response(f"request body is not valid JSON: {e}", 400, flavor)
        if not isinstance(body, dict):
            return error_response("request body must be a JSON object", 400, flavor)
        pair = self.router.select_pd_pair(RoutingRequest(routing_text(path, body)))
        if pair is None:
            return error_response("no healthy prefill and decode worker pair available", 503, flavor)
        content = orjson.dumps(pair.inject(body))
        headers = _headers(request.headers, DROP_REQUEST_HEADERS)
        timeout = httpx.Timeout(self.router.args.request_timeout_secs, connect=CONNECT_TIMEOUT_S)
        client = self.router.client
        p_guard, d_guard = LoadGuard(pair.prefill), LoadGuard(pair.decode)
        prefill = asyncio.create_task(self._prefill(pair.prefill, path, content, headers, timeout, p_guard))
        sending = asyncio.create_task(client.send(client.build_request(
            "POST", pair.decode.url + path, content=content, headers=headers, timeout=timeout), stream=True))
        self._keep(prefill)
        upstream: httpx.Response | None = None
        relayed = False
        try:
            early = await self._race(request, sending, prefill)
            if early is not None:
                return early
            upstream = sending.result()
            out_headers = {**_headers(upstream.headers, DROP_RESPONSE_HEADERS), "x-radixlm-prefill": pair.prefill.url,
                           "x-radixlm-decode": pair.decode.url}
            if bool(body.get("stream")) and upstream.status_code == 200:
                relayed = True  # the relay releases the guard and closes the response
                return StreamingResponse(self._relay(upstream, prefill, d_guard, pair.decode, flavor), 200,
                                         out_headers)
            reading = asyncio.create_task(upstream.aread())
            early = await self._race(request, reading, prefill)
            if early is not None:
                return early
            pair.decode.breaker.record(upstream.status_code < 500)
            return Response(reading.result(), upstream.status_code, out_headers)
        except httpx.HTTPError as e:
            pair.decode.breaker.record(False)
            prefill.cancel()
            return error_response(f"decode worker {pair.decode.url} failed: {type(e).__name__}: {e}", 502, flavor)
        finally:
            if not relayed:
                d_guard.release()
                if upstream is not None:
                    await upstream.aclose()

    @staticmethod
    async def _race(request: Request, task: asyncio.Task, prefill: asyncio.Task) -> Response | None:
        """Waits for `task` (the decode worker's part). A prefill error first is the answer (the decode request is
        cancelled: its worker aborts the request when the connection closes); a client gone first cancels both."""
        while not task.done():
            waiting = {task} if prefill.done() else {task, prefill}
            await asyncio.wait(waiting, timeout=DISCONNECT_POLL_S, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                break
            if prefill.done() and not prefill.cancelled() and prefill.result() is not None:
                task.cancel()
                return prefill.result()
            if await request.is_disconnected():
                task.cancel()
                prefill.cancel()
                return Response(status_code=499)
        return None

    async def _prefill(self, w: Worker, path: str, content: bytes, headers: dict, timeout: httpx.Timeout,
                       guard: LoadGuard) -> Response | None:
        """The prefill worker's part; None when it succeeded, else the error the client should get."""
        client = self.router.client
        try:
            r = await client.post(w.url + path, content=content, headers=headers, timeout=timeout)
        except httpx.HTTPError as e:
            w.breaker.record(False)
            return error_response(f"prefill worker {w.url} failed: {type(e).__name__}: {e}", 502, flavor_of(path))
        finally:
            guard.release()
        w.breaker.record(r.status_code < 500)
        if r.status_code != 200:
            return Response(r.content, r.status_code, {**_headers(r.headers, DROP_RESPONSE_HEADERS),
                                                       "x-radixlm-prefill": w.url})
        return None

    async def _relay(self, upstream: httpx.Response, prefill: asyncio.Task, guard: LoadGuard, w: Worker,
                     flavor) -> AsyncIterator[bytes]:
        ok = False
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
            ok = True
        except httpx.HTTPError as e:
            yield stream_error_event(f"decode worker {w.url} failed mid-stream: {type(e).__name__}: {e}", 502, flavor)
        finally:
            guard.release()
            w.breaker.record(ok)
            await upstream.aclose()
            if not ok:
                prefill.cancel()  # the client went away (or the stream broke): both workers drop the request


def create_pd_app(args: RouterArgs, client: httpx.AsyncClient, routes: tuple[str, ...], on_shutdown=None):
    """The PD router's HTTP app: the generation routes, /health (both pools), /liveness and GET /workers."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    router = PDRouter(args, client)
    proxy = PDProxy(router)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.check_all(first=True)
        task = asyncio.create_task(router.run_health_checks())
        yield
        task.cancel()
        await client.aclose()
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)

    app = FastAPI(lifespan=lifespan, title="radixlm router (prefill/decode disaggregation)")
    app.state.router = router
    for route in routes:
        async def handler(request: Request, _route: str = route) -> Response:
            return await proxy.forward(request, _route)
        app.add_api_route(route, handler, methods=["POST"])

    def _json(obj, status: int = 200) -> Response:
        return Response(orjson.dumps(obj), status, media_type="application/json")

    @app.get("/liveness")
    async def liveness() -> Response:
        return _json({"status": "alive"})

    @app.get("/health")
    @app.get("/readiness")
    async def health() -> Response:
        workers = router.describe_workers()
        ready = {role: sum(w["healthy"] for w in workers if w["role"] == role) for role in ("prefill", "decode")}
        ok = all(ready.values())
        return _json({"status": "healthy" if ok else "unhealthy", "healthy_prefill_workers": ready["prefill"],
                      "healthy_decode_workers": ready["decode"], "workers": workers}, 200 if ok else 503)

    @app.get("/workers")
    async def workers() -> Response:
        return _json({"workers": router.describe_workers()})

    return app
