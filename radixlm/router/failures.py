"""How the router judges a failed attempt on a worker: what the worker can have seen of the request (its Delivery,
which decides whether and how often it may go to another worker: the rule is app.py's NOTE), what the failure says
about the worker's health (its Effect), and the backoff between attempts (SGLang's router retry flags)."""
from __future__ import annotations

import enum
import random
from dataclasses import dataclass

import httpx
import orjson

from radixlm.router.args import RouterArgs
from radixlm.runtime.server.errors import ApiFlavor, error_body


class Delivery(enum.Enum):
    NOT_SENT = "not_sent"  # the worker cannot have run it: no connection, request not fully written, or a 503
    MAYBE_READ = "maybe_read"  # the connection broke after the request was sent, before an answer: it may have
    # read it and died of it (a poison request), or died of something else (a crash, a kill)
    ANSWERED = "answered"  # the worker answered (a 5xx other than 503) or is still running it (read timeout): final


class Effect(enum.Enum):
    NONE = "none"  # nothing against the worker: it answered 503 (alive, busy), or the router's own pool was full
    COUNT = "count"  # one more failure for its circuit breaker: no connection within the connect timeout
    EJECT = "eject"  # passive health check: marked down, circuit opened, back only through the active checks
    REFUSED = "refused"  # nothing listens at its address: ejected, and back after one passed health check


@dataclass(frozen=True)
class Failure:
    delivery: Delivery
    effect: Effect
    status: int  # what the client gets when no worker serves the request
    message: str  # what happened on this worker (the proxy adds what became of the request)


def _what(e: Exception) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def failure_of_exception(e: httpx.HTTPError, url: str) -> Failure:
    if isinstance(e, httpx.PoolTimeout):
        return Failure(Delivery.NOT_SENT, Effect.NONE, 503, f"no free connection to worker {url} in the router's pool")
    if isinstance(e, httpx.ConnectTimeout):
        return Failure(Delivery.NOT_SENT, Effect.COUNT, 502, f"connecting to worker {url} timed out")
    if isinstance(e, httpx.ConnectError):
        return Failure(Delivery.NOT_SENT, Effect.REFUSED, 502, f"cannot connect to worker {url}: {e}")
    # A write fails before the last byte of the request is out: the worker never had a whole request to run.
    if isinstance(e, httpx.WriteTimeout):
        return Failure(Delivery.NOT_SENT, Effect.EJECT, 504, f"worker {url} did not take the request in time "
                                                             f"({_what(e)})")
    if isinstance(e, httpx.WriteError):
        return Failure(Delivery.NOT_SENT, Effect.EJECT, 502, f"the connection to worker {url} broke while the "
                                                             f"request was being sent ({_what(e)})")
    if isinstance(e, httpx.TimeoutException):
        return Failure(Delivery.ANSWERED, Effect.EJECT, 504, f"worker {url} did not answer in time ({_what(e)})")
    return Failure(Delivery.MAYBE_READ, Effect.EJECT, 502, f"worker {url} failed while handling the request "
                                                           f"({_what(e)})")


def failure_of_status(status: int, url: str) -> Failure | None:
    """None for an answer that is not the worker's failure (2xx, 3xx, 4xx)."""
    if status == 503:
        return Failure(Delivery.NOT_SENT, Effect.NONE, 503, f"worker {url} cannot take the request now (HTTP 503)")
    if status >= 500:
        return Failure(Delivery.ANSWERED, Effect.EJECT, status, f"worker {url} answered HTTP {status}")
    return None


@dataclass(frozen=True)
class Backoff:
    """Delay before the n-th resend (n from 0): initial * multiplier**n, capped, then jittered by +-jitter."""
    initial_s: float = 0.05
    max_s: float = 30.0
    multiplier: float = 1.5
    jitter: float = 0.2

    @classmethod
    def of(cls, args: RouterArgs) -> Backoff:
        return cls(args.retry_initial_backoff_ms / 1000, args.retry_max_backoff_ms / 1000,
                   args.retry_backoff_multiplier, args.retry_jitter_factor)

    def delay_s(self, n: int, rand: random.Random | None = None) -> float:
        base = min(self.initial_s * self.multiplier ** n, self.max_s)
        u = (rand or random).uniform(-1.0, 1.0)
        return max(0.0, base * (1.0 + self.jitter * u))


def stream_error_event(message: str, status: int, flavor: ApiFlavor) -> bytes:
    """The SSE event that ends a stream its worker broke: Anthropic's `event: error`, else `data: {"error": ...}`."""
    body = error_body(message, status, flavor)
    if flavor is ApiFlavor.ANTHROPIC:
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"
    return b"data: " + orjson.dumps(body if flavor is ApiFlavor.OPENAI else {"error": body}) + b"\n\n"
