"""What a scheduler loop does when a step raises. Errors in one request's own data are caught where that data is
handled (Scheduler.add_request, the output processor) and fail only that request. An exception that escapes a step
cannot be pinned on one request: the requests holding KV are failed with a 500 and the pools start afresh
(fail_after_error). If the next step fails too, the queued requests go as well (the cause may be
among them); a third failure in a row, or a device fault, is fatal: the loop's owner fails everything and the
process exits non-zero, so that a supervisor restarts it instead of a server that answers 503 forever."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.messages import BatchReqOutput
from radixlm.runtime.scheduler.req import FinishReason

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

MAX_FAILED_STEPS = 3


class FatalSchedulerError(RuntimeError):
    """The scheduler cannot go on (a device fault, broken pools, or steps failing in a row)."""


def is_device_fault(e: BaseException) -> bool:
    """A CUDA fault leaves the context unusable: no later step can succeed."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(e, accelerator_error):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("CUDA error" in text or "CUBLAS_STATUS" in text or "device-side assert" in text)


@dataclass
class StepGuard:
    sched: Scheduler
    fatal: bool = False  # every failure is fatal (tensor parallel: ranks cannot recover alike)
    failed_steps: int = 0  # consecutive steps that raised (set by step)

    def step(self) -> BatchReqOutput:
        try:
            out = self.sched.step()
        except Exception as e:  # noqa: BLE001 - classified below
            self.failed_steps += 1
            if self.fatal or is_device_fault(e) or self.failed_steps >= MAX_FAILED_STEPS:
                raise FatalSchedulerError(f"scheduler step failed ({self.failed_steps} in a row): "
                                          f"{type(e).__name__}: {e}") from e
            logger.exception("scheduler step failed (%d in a row); failing the running requests", self.failed_steps)
            try:
                fail_after_error(self.sched, f"internal error in the scheduler: {type(e).__name__}: {e}",
                                 fail_waiting=self.failed_steps > 1)
            except Exception as again:  # noqa: BLE001 - the pools cannot be put right
                raise FatalSchedulerError(f"cannot recover from a failed step: {type(again).__name__}: {again}") from e
            return self.sched.outbox.take()
        self.failed_steps = 0
        return out


def fail_after_error(sched: Scheduler, message: str, fail_waiting: bool) -> None:
    """After a step raised: ends every request holding KV (and, if fail_waiting, every queued one) with a 500 and
    starts the pools afresh, the tree's cached prefixes included, so that the accounting holds again whatever
    the failed step left half done."""
    held = sched.running + (sched.inflight.batch.reqs if sched.inflight is not None else [])
    held += sched.launching.reqs if sched.launching is not None else []
    sched.inflight, sched.launching = None, None
    failed = list({id(r): r for r in held if not r.finished()}.values())
    if sched.chunked_req is not None and not sched.chunked_req.finished() and sched.chunked_req not in failed:
        failed.append(sched.chunked_req)
    queued = sched.waiting_queue + (sched.grammar_queue.queue if fail_waiting else [])
    failed += [r for r in queued if fail_waiting or r.req_pool_idx is not None]
    sched.waiting_queue = [r for r in sched.waiting_queue if not fail_waiting and r.req_pool_idx is None]
    if fail_waiting:
        sched.grammar_queue.queue = []
    for req in failed:
        req.finished_reason = FinishReason.aborted(message, status_code=500)
        sched.outbox.emit(req)
    for req in sched.waiting_queue:
        req.reset_kv_state()
        req.match_round = -1
    sched.running = []
    sched.chunked_req = None
    sched.tree_cache.reset()
    sched.req_to_token_pool.clear()
    sched.allocator.clear()
    sched.check_memory()
