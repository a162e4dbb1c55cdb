"""The offline Engine's control messages (cache flush, LoRA loads and unloads, weights and memory requests): each
caller waits on the scheduler thread's answer to its own message."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from radixlm.runtime.engine_results import EngineHealth
from radixlm.runtime.messages import (
    FlushCacheReq, FlushCacheReqOutput, LoadLoRAAdapterReqInput, LoRAUpdateOutput, SchedulerInput,
    UnloadLoRAAdapterReqInput, WeightsReqInput, WeightsReqOutput,
)


@dataclass
class FlushCacheCall(FlushCacheReq):
    """A flush request that carries its caller's wait (set by ControlChannel.reply)."""

    answer: FlushCacheReqOutput | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __reduce__(self):
        return FlushCacheReq, ()  # what other tensor-parallel ranks receive: the request without the caller's wait


@dataclass
class LoadLoraCall(LoadLoRAAdapterReqInput):
    answer: LoRAUpdateOutput | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __reduce__(self):
        return LoadLoRAAdapterReqInput, (self.lora_name, self.lora_path, self.lora_id, self.pinned)


@dataclass
class UnloadLoraCall(UnloadLoRAAdapterReqInput):
    answer: LoRAUpdateOutput | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __reduce__(self):
        return UnloadLoRAAdapterReqInput, (self.lora_name, self.lora_id)


class ControlChannel:
    def __init__(self, send: Callable[[SchedulerInput], None], health: EngineHealth):
        """send: puts a message in the scheduler's inbox."""
        self.send = send
        self.health = health
        self._waiters: dict[int, tuple[threading.Event, list]] = {}  # id(weights request) -> (done, [answer])

    def reply(self, req, answer) -> None:
        """The scheduler's answer to req (on the scheduler thread)."""
        if isinstance(req, (FlushCacheCall, LoadLoraCall, UnloadLoraCall)):
            req.answer = answer
            req.done.set()
            return
        waiter = self._waiters.pop(id(req), None)
        if waiter is not None:
            waiter[1].append(answer)
            waiter[0].set()

    def flush_cache(self) -> bool:
        msg = FlushCacheCall()
        self.send(msg)
        msg.done.wait()
        return msg.answer.success

    def call(self, msg: WeightsReqInput) -> tuple[bool, str]:
        """Sends a weights request and waits for its answer (success, message)."""
        if self.health.error() is not None:
            raise RuntimeError(f"the engine's scheduler has failed: {self.health.error()!r}")
        done, box = threading.Event(), []
        self._waiters[id(msg)] = (done, box)
        self.send(msg)
        while not done.wait(0.5):
            if self.health.error() is not None or not self.health.alive():
                self._waiters.pop(id(msg), None)
                raise RuntimeError(f"the engine's scheduler stopped: {self.health.error()!r}")
        answer: WeightsReqOutput = box[0]
        return answer.success, answer.message

    def ask(self, msg: LoadLoraCall | UnloadLoraCall) -> None:
        """Sends a LoRA message and waits for its answer (RuntimeError if the scheduler fails meanwhile)."""
        if self.health.error() is not None or self.health.stopped():
            raise RuntimeError(f"the engine's scheduler is not running: {self.health.error()!r}")
        self.send(msg)
        while not msg.done.wait(0.5):
            if self.health.error() is not None or not self.health.alive():
                raise RuntimeError(f"the engine's scheduler has failed: {self.health.error()!r}")
