"""Fake workers behind an httpx.MockTransport (no model, no sockets) and a router app over them, driven through
ASGITransport with the app's lifespan running."""
from __future__ import annotations

import asyncio
import enum
import json
from collections import defaultdict

import httpx

from radixlm.router.app import GENERATION_ROUTES, POOLING_ROUTES, create_app
from radixlm.router.args import RouterArgs


class Mode(enum.Enum):
    """How a fake worker treats generation requests (everything but DOWN passes /health)."""
    OK = "ok"
    DOWN = "down"  # nothing listens: every connection is refused, health checks included
    REFUSE = "refuse"  # connection refused
    CONNECT_TIMEOUT = "connect_timeout"
    POOL_TIMEOUT = "pool_timeout"  # the router's own pool had no free connection
    BUSY = "busy"  # HTTP 503 with Retry-After (queue full)
    ERROR = "error"  # HTTP 500
    DROP = "drop"  # took the request, then the connection closed without an answer (the worker died)
    READ_ERROR = "read_error"  # took the request, then the connection was reset
    READ_TIMEOUT = "read_timeout"
    BREAK_STREAM = "break_stream"  # streams one event, then the connection is reset

    @property
    def accepts(self) -> bool:
        """Whether a request in this mode reaches the worker at all."""
        return self not in (Mode.DOWN, Mode.REFUSE, Mode.CONNECT_TIMEOUT, Mode.POOL_TIMEOUT)


RAISES = {Mode.REFUSE: httpx.ConnectError, Mode.CONNECT_TIMEOUT: httpx.ConnectTimeout,
                  Mode.POOL_TIMEOUT: httpx.PoolTimeout, Mode.DROP: httpx.RemoteProtocolError,
                  Mode.READ_ERROR: httpx.ReadError, Mode.READ_TIMEOUT: httpx.ReadTimeout}


def first_event(path: str) -> bytes:
    if path.startswith("/v1/messages"):
        return b'event: message_start\ndata: {"type": "message_start"}\n\n'
    return b'data: {"text": "a"}\n\n'


class FakeFleet:
    """Workers by host name, each in a Mode (set by the test)."""

    def __init__(self, *hosts: str) -> None:
        self.mode = {h: Mode.OK for h in hosts}
        self.received: dict[str, list[dict]] = defaultdict(list)  # generation bodies that reached each worker
        self.generate_calls: dict[str, int] = defaultdict(int)  # generations each worker served
        self.health_checks: dict[str, int] = defaultdict(int)
        self.flushed: list[str] = []
        self.poison: str | None = None  # a generation body holding it kills the worker that reads it (set by tests)

    def __call__(self, req: httpx.Request) -> httpx.Response:
        host, path, mode = req.url.host, req.url.path, self.mode.get(req.url.host, Mode.DOWN)
        if mode is Mode.DOWN:
            raise httpx.ConnectError("connection refused", request=req)
        if path == "/health":
            self.health_checks[host] += 1
            return httpx.Response(200)
        if path in GENERATION_ROUTES + POOLING_ROUTES:
            return self.generate(req, host, path, mode)
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "default", "object": "model"}]})
        if path == "/flush_cache":
            self.flushed.append(host)
            return httpx.Response(200, text="Cache flushed.\n")
        if path == "/v1/loads":
            return httpx.Response(200, json={"loads": [{"dp_rank": 0, "num_running_reqs": 0}]})
        return httpx.Response(404)

    def generate(self, req: httpx.Request, host: str, path: str, mode: Mode) -> httpx.Response:
        body = json.loads(req.content)
        if mode.accepts:
            self.received[host].append(body)
        if mode.accepts and self.poison is not None and self.poison in req.content.decode():
            self.mode[host] = Mode.DOWN
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=req)
        if mode in RAISES:
            raise RAISES[mode]("fake failure", request=req)
        if mode is Mode.BUSY:
            return httpx.Response(503, headers={"Retry-After": "1"},
                                  json={"object": "error", "message": "overloaded", "code": 503})
        if mode is Mode.ERROR:
            return httpx.Response(500, json={"object": "error", "message": "scheduler crashed", "code": 500})
        if body.get("stream"):
            async def events():
                yield first_event(path)
                if mode is Mode.BREAK_STREAM:
                    raise httpx.ReadError("connection reset", request=req)
                yield b"data: [DONE]\n\n"
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())
        self.generate_calls[host] += 1
        return httpx.Response(200, json={"text": f"from {host}", "meta_info": {"id": "x"}})


async def with_router(fleet: FakeFleet, fn, **kw) -> None:
    args = RouterArgs(worker_urls=[f"http://{h}:1" for h in fleet.mode], **kw)
    app = create_app(args, transport=httpx.MockTransport(fleet))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://router") as client:
            await fn(client, app.state.router)


def run(fleet: FakeFleet, fn, **kw) -> None:
    asyncio.run(with_router(fleet, fn, **kw))
