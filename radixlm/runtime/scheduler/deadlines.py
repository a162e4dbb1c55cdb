"""Request deadlines: the server's waiting and running limits (SGLang's SGLANG_REQ_WAITING_TIMEOUT and
SGLANG_REQ_RUNNING_TIMEOUT, or --req-waiting-timeout / --req-running-timeout, which win) and a request's own
`timeout_s`. A request past one is aborted: waiting ones at once, running ones at the next step with their KV
released to the tree (Scheduler.abort_expired).

The waiting limit counts from arrival until the first prefill; the running limit from the first prefill (a retracted
request's time back in the queue counts as running, as SGLang's does from the request's first forward pass);
timeout_s from arrival, whatever the request is doing. The server's limits abort with SGLang's messages and HTTP 503;
timeout_s ends the request with finish_reason abort and what it generated so far (HTTP 200)."""
from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.scheduler.req import Req

WAITING_TIMEOUT_ENV = "SGLANG_REQ_WAITING_TIMEOUT"
RUNNING_TIMEOUT_ENV = "SGLANG_REQ_RUNNING_TIMEOUT"
WAITING_TIMEOUT_MESSAGE = "Request waiting timeout reached."
RUNNING_TIMEOUT_MESSAGE = "Request running timeout reached."
SERVER_TIMEOUT_STATUS = 503
# An abort on the request's own timeout_s: no status code, the client gets its output so far.
Expired = tuple[str, str, int | None]


def request_timeout_message(timeout_s: float) -> str:
    return f"Request timeout reached (timeout_s={timeout_s:g})."


def _limit(flag: float | None, env: Mapping[str, str], name: str) -> float | None:
    """The flag's value, else the environment's; None: no limit (0 or less means none, as in SGLang)."""
    if flag is None:
        raw = env.get(name, "").strip()
        if not raw:
            return None
        try:
            flag = float(raw)
        except ValueError:
            raise ValueError(f"${name} must be a number of seconds, got {raw!r}") from None
        if not math.isfinite(flag):
            raise ValueError(f"${name} must be a finite number of seconds, got {raw!r}")
    return flag if flag > 0 else None


@dataclass(frozen=True)
class DeadlineConfig:
    waiting_timeout_s: float | None = None
    running_timeout_s: float | None = None

    @classmethod
    def from_args(cls, args: ServerArgs, env: Mapping[str, str] | None = None) -> "DeadlineConfig":
        env = os.environ if env is None else env
        return cls(_limit(args.req_waiting_timeout, env, WAITING_TIMEOUT_ENV),
                   _limit(args.req_running_timeout, env, RUNNING_TIMEOUT_ENV))


class Deadlines:
    def __init__(self, config: DeadlineConfig, checks: bool = True):
        """checks: this scheduler looks for expired requests (tensor-parallel rank 0; the others abort what it
        finds)."""
        self.config = config
        self.checks = checks
        self.timed: dict[str, Req] = {}  # live requests with their own timeout_s (dropped once found finished)

    def track(self, req: Req) -> None:
        if self.checks and req.timeout_s is not None:
            self.timed[req.rid] = req

    @property
    def active(self) -> bool:
        """Whether any deadline can expire: a server limit is set, or a live request has its own."""
        c = self.config
        return self.checks and (c.waiting_timeout_s is not None or c.running_timeout_s is not None or bool(self.timed))

    def expired(self, live: Iterable[Req], now: float) -> list[Expired]:
        """The requests among `live` (every unfinished request the scheduler holds) past a deadline at `now`."""
        c = self.config
        out: list[Expired] = []
        seen: set[str] = set()
        if c.waiting_timeout_s is not None or c.running_timeout_s is not None:
            for req in live:
                if req.finished() or req.to_abort is not None:  # (being aborted: at the next step)
                    continue
                if req.started_at is None:
                    if c.waiting_timeout_s is not None and now - req.arrived > c.waiting_timeout_s:
                        out.append((req.rid, WAITING_TIMEOUT_MESSAGE, SERVER_TIMEOUT_STATUS))
                        seen.add(req.rid)
                elif c.running_timeout_s is not None and now - req.started_at > c.running_timeout_s:
                    out.append((req.rid, RUNNING_TIMEOUT_MESSAGE, SERVER_TIMEOUT_STATUS))
                    seen.add(req.rid)
        for rid, req in list(self.timed.items()):
            if req.finished():
                del self.timed[rid]
            elif rid not in seen and req.to_abort is None and now - req.arrived > req.timeout_s:
                out.append((rid, request_timeout_message(req.timeout_s), None))
        return out
