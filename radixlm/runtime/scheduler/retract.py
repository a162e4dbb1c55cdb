"""Retraction: a running request goes back to the waiting queue, its KV to the radix tree. The pool running out
(retract_decode) and a higher-priority request preempting it (Admission, priority.py) both retract this way."""
from __future__ import annotations

import time
from typing import Callable

from radixlm.runtime.scheduler.planner import Planner
from radixlm.runtime.scheduler.req import Req

RETRACT_DECODE_STEPS = 20


def retract(req: Req, planner: Planner, now: float) -> None:
    """Its KV goes to the radix tree as evictable cache (most recently used, so evicted last): what survives is a
    prefix hit when the request, which keeps its output, is admitted again, and it resumes with the tokens an
    unretracted run would have produced. Its tokens must all be on the host (no pass of it in flight)."""
    planner.release(req)
    req.reset_kv_state()  # a draft is dropped too: decoding resumes from the last output token
    req.num_retractions += 1
    req.requeued_at(now)


def retract_decode(running: list[Req], planner: Planner,
                   rank: Callable[[Req], int] | None = None) -> tuple[list[Req], float]:
    """Removes requests from `running` until its next pass fits; the lowest `rank` first (priority scheduling),
    then fewest output tokens (ties: longest input). Every token must be on the host (no pass in flight). Returns
    the retracted requests and the new_token_ratio to use."""
    now = time.monotonic()
    if rank is None:
        order = sorted(running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)
    else:
        order = sorted(running, key=lambda r: (rank(r), len(r.output_ids), -len(r.origin_input_ids)), reverse=True)
    retracted: list[Req] = []
    while not planner.fits(running):
        if len(order) == 1:
            break  # the caller aborts the last one
        req = order.pop()
        retracted.append(req)
        running.remove(req)
        retract(req, planner, now)
    total_decoded = sum(len(r.output_ids) for r in running)
    total_max_new = sum(r.sampling_params.max_new_tokens for r in running)
    ratio = (total_decoded + RETRACT_DECODE_STEPS * len(running)) / (total_max_new + 1)
    return retracted, min(1.0, ratio)
