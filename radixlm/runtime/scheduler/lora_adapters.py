"""The scheduler's side of LoRA serving (under --enable-lora): the slot table, each pass's slots and swaps, adapter
loads (carried out by the runner's LoraManager) and unloads, which wait until no queued or running request uses
their adapter."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.lora.registry import startup_refs
from radixlm.runtime.lora.slots import SlotTable
from radixlm.runtime.messages import LoadLoRAAdapterReqInput, LoRAUpdateOutput, UnloadLoRAAdapterReqInput

if TYPE_CHECKING:
    from radixlm.runtime.lora.manager import LoraManager
    from radixlm.runtime.scheduler.planner import ScheduleBatch
    from radixlm.runtime.scheduler.req import Req


class LoraAdapters:
    def __init__(self, args: ServerArgs, manager: "LoraManager", requests: Callable[[bool], list["Req"]]):
        """requests(queued): the running requests, the chunked one and the pass in flight's; with queued, the waiting
        ones and those whose grammar compiles too."""
        self.manager = manager
        self.requests = requests
        self.slots = SlotTable(args.max_loras_per_batch)
        for ref in startup_refs(args.lora_paths):
            if ref.pinned:
                self.slots.pin(ref.lora_id)
        self.unloads: list[UnloadLoRAAdapterReqInput] = []  # waiting for their adapter's requests

    def users(self, queued: bool = False) -> set[str | None]:
        return {r.lora_id for r in self.requests(queued) if not r.finished()}

    def check_request(self, lora_id: str | None) -> None:
        if lora_id is not None and lora_id not in self.manager.adapters:
            raise ValueError("its LoRA adapter was unloaded before it arrived")

    def plan(self, batch: "ScheduleBatch") -> None:
        """The pass's slots; pinned: every running request's adapter (admission kept them, with this pass's, within
        the slots)."""
        batch.worker.lora = self.slots.assign([r.lora_id for r in batch.reqs], self.users())

    def load(self, msg: LoadLoRAAdapterReqInput) -> LoRAUpdateOutput:
        try:
            if msg.pinned:
                self.slots.pin(msg.lora_id)
            self.manager.load_adapter(msg.lora_id, msg.lora_name, msg.lora_path)
        except ValueError as e:
            self.slots.release(msg.lora_id)
            return LoRAUpdateOutput(msg.lora_id, False, str(e))
        return LoRAUpdateOutput(msg.lora_id, True)

    def finish_unloads(self) -> list[tuple[UnloadLoRAAdapterReqInput, LoRAUpdateOutput]]:
        """The unloads no queued or running request waits for any more, carried out."""
        if not self.unloads:
            return []
        users = self.users(queued=True)
        done = [m for m in self.unloads if m.lora_id not in users]
        self.unloads = [m for m in self.unloads if m.lora_id in users]
        out = []
        for msg in done:
            try:
                self.manager.unload_adapter(msg.lora_id)
                self.slots.release(msg.lora_id)
                out.append((msg, LoRAUpdateOutput(msg.lora_id, True)))
            except ValueError as e:
                out.append((msg, LoRAUpdateOutput(msg.lora_id, False, str(e))))
        return out
