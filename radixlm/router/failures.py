"""How the router judges a failed attempt on a worker: may the request go to another worker, and what does the
failure say about the worker (the rule is app.py's NOTE). A request is resent only when the worker never accepted
it; anything the router cannot place before acceptance counts as after, so a request that kills its worker
(a poison pill) kills one worker, not the fleet."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import httpx
import orjson

from radixlm.runtime.server.errors import ApiFlavor, error_body


class Effect(enum.Enum):
    NONE = "none"  # nothing against the worker: it answered 503 (alive, busy), or the router's own pool was full
    COUNT = "count"  # one more failure for its circuit breaker: no connection within the connect timeout
    EJECT = "eject"  # passive health check: marked down, circuit opened, back only through the active checks


@dataclass(frozen=True)
class Failure:
    resend: bool  # True only when the worker never accepted the request
    effect: Effect
    status: int  # what the client gets when no worker serves the request
    message: str


def failure_of_exception(e: httpx.HTTPError, url: str) -> Failure:
    if isinstance(e, httpx.PoolTimeout):
        return Failure(True, Effect.NONE, 503, f"no free connection to worker {url} in the router's pool")
    if isinstance(e, httpx.ConnectTimeout):
        return Failure(True, Effect.COUNT, 502, f"connecting to worker {url} timed out")
    if isinstance(e, httpx.ConnectError):
        return Failure(True, Effect.EJECT, 502, f"cannot connect to worker {url}: {e}")
    # From here on the request was sent, at least in part: the worker may be running it.
    what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if isinstance(e, httpx.TimeoutException):
        return Failure(False, Effect.EJECT, 504, f"worker {url} did not answer in time ({what}); "
                                                 "the request was not resent")
    return Failure(False, Effect.EJECT, 502, f"worker {url} failed while handling the request ({what}); "
                                             "the request was not resent")


def failure_of_status(status: int, url: str) -> Failure | None:
    """None for an answer that is not the worker's failure (2xx, 3xx, 4xx)."""
    if status == 503:
        return Failure(True, Effect.NONE, 503, f"worker {url} cannot take the request now (HTTP 503)")
    if status >= 500:
        return Failure(False, Effect.EJECT, status, f"worker {url} answered HTTP {status}; "
                                                    "the request was not resent")
    return None


def stream_error_event(message: str, status: int, flavor: ApiFlavor) -> bytes:
    """The SSE event that ends a stream its worker broke: Anthropic's `event: error`, else `data: {"error": ...}`."""
    body = error_body(message, status, flavor)
    if flavor is ApiFlavor.ANTHROPIC:
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"
    return b"data: " + orjson.dumps(body if flavor is ApiFlavor.OPENAI else {"error": body}) + b"\n\n"
