"""What a scheduler loop does when a step raises. Errors in one request's own data are caught where that data is
handled (Scheduler.add_request, the output processor) and fail only that request. An exception that escapes a step
cannot be pinned on one request: the requests holding KV are failed with a 500 and the pools start afresh
(Scheduler.fail_after_error). If the next step fails too, the queued requests go as well (the cause may be
among them); a third failure in a row, or a device fault, is fatal: the loop's owner fails everything and the
process exits non-zero, so that a supervisor restarts it instead of a server that answers 503 forever."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.runtime.messages import ReqOutput

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

MAX_FAILED_STEPS = 3


class FatalSchedulerError(RuntimeError):
    """The scheduler cannot go on (a device fault, broken pools, or steps failing in a row)."""


def is_device_fault(e: BaseException) -> bool:
    """A CUDA fault leaves the context unusable: no later step can succeed."""
    import torch  # not at module level: `import radixlm` stays free of torch

    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(e, accelerator_error):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("CUDA error" in text or "CUBLAS_STATUS" in text or "device-side assert" in text)


@dataclass
class StepGuard:
    sched: Scheduler
    failed_steps: int = 0  # consecutive steps that raised (set by step)

    def step(self) -> list[ReqOutput]:
        try:
            out = self.sched.step()
        except Exception as e:  # noqa: BLE001 - classified below
            self.failed_steps += 1
            if is_device_fault(e) or self.failed_steps >= MAX_FAILED_STEPS:
                raise FatalSchedulerError(f"scheduler step failed ({self.failed_steps} in a row): "
                                          f"{type(e).__name__}: {e}") from e
            logger.exception("scheduler step failed (%d in a row); failing the running requests", self.failed_steps)
            try:
                self.sched.fail_after_error(f"internal error in the scheduler: {type(e).__name__}: {e}",
                                            fail_waiting=self.failed_steps > 1)
            except Exception as again:  # noqa: BLE001 - the pools cannot be put right
                raise FatalSchedulerError(f"cannot recover from a failed step: {type(again).__name__}: {again}") from e
            out, self.sched.outputs = self.sched.outputs, []
            return out
        self.failed_steps = 0
        return out
