"""/v1/responses through the router. A worker keeps the responses it made in its own store, so a request that
continues one (`previous_response_id`) and a GET or DELETE of one must reach the worker that made it. The router
learns each response's worker from the answers it relays (the JSON body's `id`, or a stream's `response.created`
event) and keeps the last `capacity` of them."""
from __future__ import annotations

from collections import OrderedDict

import orjson

RESPONSES_ROUTE = "/v1/responses"
_CREATED = b"response.created"
MAX_PENDING_LINE = 1 << 20  # a longer SSE line is dropped unparsed rather than held without bound


class ResponseOwners:
    """Response id -> the URL of the worker that stores it; the least recently used entries go first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()

    def record(self, response_id: str, url: str) -> None:
        self._owners[response_id] = url
        self._owners.move_to_end(response_id)
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def owner(self, response_id: str | None) -> str | None:
        if response_id is None or response_id not in self._owners:
            return None
        self._owners.move_to_end(response_id)
        return self._owners[response_id]

    def forget(self, response_id: str) -> None:
        self._owners.pop(response_id, None)

    def __len__(self) -> int:
        return len(self._owners)


def previous_id(body: dict) -> str | None:
    prev = body.get("previous_response_id")
    return prev if isinstance(prev, str) and prev else None


def response_id_of_body(content: bytes) -> str | None:
    """The `id` of a whole Response object."""
    try:
        obj = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, dict) and obj.get("object") == "response" and isinstance(obj.get("id"), str):
        return obj["id"]
    return None


class SseResponseIdScanner:
    """Fed each raw chunk of a Responses stream; finds the response's id in its `response.created` event (the
    stream's first), then ignores the rest."""

    def __init__(self) -> None:
        self._pending = b""
        self.response_id: str | None = None

    def feed(self, chunk: bytes) -> None:
        if self.response_id is not None:
            return
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_PENDING_LINE:
            self._pending = b""
        for line in lines:
            if line.startswith(b"data:") and _CREATED in line:
                try:
                    obj = orjson.loads(line[5:].strip())
                except orjson.JSONDecodeError:
                    continue
                resp = obj.get("response") if isinstance(obj, dict) else None
                if obj.get("type") == "response.created" and isinstance(resp, dict) and isinstance(resp.get("id"), str):
                    self.response_id = resp["id"]
                    return
