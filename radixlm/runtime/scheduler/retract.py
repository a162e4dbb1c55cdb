"""Retraction: when the running requests' next pass does not fit the KV pool, some go back to the waiting queue."""
from __future__ import annotations

from radixlm.runtime.scheduler.planner import Planner
from radixlm.runtime.scheduler.req import Req

RETRACT_DECODE_STEPS = 20


def retract_decode(running: list[Req], planner: Planner) -> tuple[list[Req], float]:
    """Removes requests from `running` until its next pass fits; fewest output tokens go first (ties: longest
    input). Their KV goes to the radix tree as evictable cache (most recently used, so evicted last): the memory
    check evicts what the next pass needs, and what survives is a prefix hit when the request, which keeps its
    output, is admitted again. Every token must be on the host (no pass in flight). Returns the retracted requests
    and the new_token_ratio to use."""
    order = sorted(running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)
    retracted: list[Req] = []
    while not planner.fits(running):
        if len(order) == 1:
            break  # the caller aborts the last one
        req = order.pop()
        retracted.append(req)
        running.remove(req)
        planner.release(req)
        req.reset_kv_state()  # a draft is dropped too: decoding resumes from the last output token
        req.num_retractions += 1
    total_decoded = sum(len(r.output_ids) for r in running)
    total_max_new = sum(r.sampling_params.max_new_tokens for r in running)
    ratio = (total_decoded + RETRACT_DECODE_STEPS * len(running)) / (total_max_new + 1)
    return retracted, min(1.0, ratio)
