"""Priority scheduling (--enable-priority-scheduling): the one rule that ranks requests, for the waiting queue's
order (SchedulePolicy.calc_priority), for which running requests admission preempts (Admission), and for which ones
retraction sends back first (retract_decode).

A request's rank is its priority (higher first, SGLang's default; negated with --schedule-low-priority-values-first;
--default-priority-value when it gives none) plus one for every --priority-aging-interval seconds it has spent in the
waiting queue (before its first prefill and after each retraction). Aging bounds starvation: a request waits at most
about (top rank among the others - its priority) x the interval beyond what the pool itself forces, and a running
request preempted again and again gains rank while it waits, until no newcomer outranks it by more than the
threshold. A running request is preempted only by a waiting one that outranks it by more than
--priority-scheduling-preemption-threshold; preemption is a retraction (retract.retract): its KV goes to the radix
tree, it keeps its output and resumes from its cached prefix, so its tokens are those of an unpreempted run."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    from radixlm.runtime.args import ServerArgs
    from radixlm.runtime.scheduler.req import Req

PRIORITY_DISABLED_MESSAGE = ("Using priority is disabled for this server. Please send a new request without a "
                             "priority.")


@dataclass(frozen=True)
class PriorityConfig:
    enabled: bool = False
    low_values_first: bool = False
    preemption_threshold: int = 10
    default_priority: int = 0
    aging_interval_s: float = 0.0  # 0: no aging
    abort_when_disabled: bool = False  # without `enabled`, a request that gives a priority fails (HTTP 503)

    @classmethod
    def from_args(cls, args: "ServerArgs") -> "PriorityConfig":
        return cls(args.enable_priority_scheduling, args.schedule_low_priority_values_first,
                   args.priority_scheduling_preemption_threshold, args.default_priority_value,
                   args.priority_aging_interval, args.abort_on_priority_when_disabled)


class PriorityRule:
    def __init__(self, config: PriorityConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def rank(self, req: "Req", now: float) -> int:
        """Higher is served first."""
        c = self.config
        base = c.default_priority if req.priority is None else req.priority
        if c.low_values_first:
            base = -base
        if c.aging_interval_s > 0:
            base += int(req.waited_s(now) // c.aging_interval_s)
        return base

    def order(self, waiting: list["Req"], deprioritized: set["Req"]) -> None:
        """Sorts `waiting` in place by rank, keeping the schedule policy's order within a rank; the policy's
        deprioritized requests (in-batch prefix sharing) go last within theirs."""
        now = self.clock()
        waiting.sort(key=lambda r: (-self.rank(r, now), r in deprioritized))

    def outranks(self, req: "Req", victim: "Req", now: float) -> bool:
        return self.rank(req, now) > self.rank(victim, now) + self.config.preemption_threshold

    def may_preempt(self, waiting: Iterable["Req"], running: list["Req"]) -> bool:
        """Whether some waiting request outranks some running one (one pass over each queue, no sorting)."""
        if not self.enabled or not running:
            return False
        now = self.clock()
        top = max((self.rank(r, now) for r in waiting), default=None)
        return top is not None and top > min(self.rank(r, now) for r in running) + self.config.preemption_threshold

    def victim(self, req: "Req", running: list["Req"]) -> "Req | None":
        """The running request `req` preempts next: the lowest rank it outranks, the latest started (then arrived)
        among equals; None when it outranks none."""
        now = self.clock()
        candidates = [r for r in running if not r.finished() and self.outranks(req, r, now)]
        if not candidates:
            return None
        return min(candidates, key=lambda r: (self.rank(r, now), -(r.started_at or 0.0), -r.arrived))

    def retract_key(self, now: float) -> Callable[["Req"], int]:
        """For retraction's order: the lowest rank is retracted first."""
        return lambda r: self.rank(r, now)
