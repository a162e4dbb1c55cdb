"""ASGI middleware in front of every route: the API key check (--api-key) and the queue limit
(--max-queued-requests) on generation routes. Pure ASGI rather than BaseHTTPMiddleware, so a
streaming response counts as in flight until its last chunk is sent or its client goes away."""
from __future__ import annotations

import hmac

from radixlm.runtime.server.errors import error_response, flavor_of

OPEN_PREFIXES = ("/health", "/metrics")
GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses",
                              "/v1/messages"})


def _presented_key(scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
        elif name == b"x-api-key":  # what Anthropic clients send
            return value.decode("latin-1").strip()
    return None


class GuardMiddleware:
    def __init__(self, app, tokenizer_manager) -> None:
        self.app = app
        self.tm = tokenizer_manager

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        key = self.tm.server_args.api_key
        if key is not None and not path.startswith(OPEN_PREFIXES):
            given = _presented_key(scope)
            if given is None or not hmac.compare_digest(given.encode(), key.encode()):
                resp = error_response("invalid or missing API key (send 'Authorization: Bearer <key>')", 401,
                                      flavor_of(path))
                await resp(scope, receive, send)
                return
        if scope["method"] in ("POST", "PUT") and path in GENERATION_PATHS:
            if not self.tm.admit():
                resp = error_response(f"queue full: {self.tm.in_flight()} requests in flight; retry later", 503,
                                      flavor_of(path))
                await resp(scope, receive, send)
                return
            try:
                await self.app(scope, receive, send)
            finally:
                self.tm.release()
            return
        await self.app(scope, receive, send)
