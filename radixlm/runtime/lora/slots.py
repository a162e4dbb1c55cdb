"""The scheduler's side of the slot pool: which adapter each of the `--max-loras-per-batch` device slots holds, and
for each pass which slot each request reads and which adapters are swapped in first (least recently used slots
first). An adapter that a running request uses keeps its slot, and so does one loaded as `pinned` (SGLang's), for as
long as it is loaded. Every tensor-parallel rank makes the same decisions from the same inputs."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

BASE_SLOT = -1  # rows of requests without an adapter


@dataclass(frozen=True)
class LoraBatch:
    """A pass's adapters (set by the scheduler in ModelWorkerBatch.lora, carried out by LoraManager.prepare)."""

    req_slots: tuple[int, ...]  # per request, in the pass's order; BASE_SLOT: the base model
    loads: tuple[tuple[int, str], ...]  # (slot, lora_id) to write before the pass runs


class SlotTable:
    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError("the LoRA slot pool needs at least one slot")
        self.num_slots = num_slots
        self.holder: list[str | None] = [None] * num_slots
        self._slot: dict[str, int] = {}  # holder's inverse: a pass looks up each request's slot
        self._lru: OrderedDict[int, None] = OrderedDict((s, None) for s in range(num_slots))  # oldest use first
        self.pinned: set[str] = set()  # adapters loaded as pinned: never swapped out

    def slot_of(self, lora_id: str) -> int | None:
        return self._slot.get(lora_id)

    def fits(self, active: set[str | None], lora_id: str | None) -> bool:
        """Whether a batch whose adapters are `active` can take a request of `lora_id` too."""
        ids = (active | {lora_id} | self.pinned) - {None}
        return len(ids) <= self.num_slots

    def pin(self, lora_id: str) -> None:
        """Keeps the adapter in a slot until it is released; at least one slot stays for the others."""
        if len(self.pinned | {lora_id}) >= self.num_slots:
            raise ValueError(f"pinning it would leave no slot of --max-loras-per-batch {self.num_slots} for "
                             f"unpinned adapters ({len(self.pinned)} pinned)")
        self.pinned.add(lora_id)

    def assign(self, lora_ids: Iterable[str | None], pinned: set[str | None]) -> LoraBatch:
        """Slots for a pass's requests (their lora ids in order). Adapters not resident take free slots, then those
        of unpinned adapters, least recently used first. Raises if the pass's and pinned adapters exceed the slots
        (admission keeps them within: SlotTable.fits)."""
        ids = list(lora_ids)
        needed = {i for i in ids if i is not None}
        keep = needed | {p for p in pinned if p is not None} | self.pinned
        if len(keep) > self.num_slots:
            raise RuntimeError(f"{len(keep)} LoRA adapters in use exceed the {self.num_slots} slots")
        loads = []
        for lora_id in sorted(needed - self._slot.keys()):
            slot = next(s for s in self._lru if self.holder[s] is None or self.holder[s] not in keep)
            self._set(slot, lora_id)
            loads.append((slot, lora_id))
        slots = tuple(BASE_SLOT if lora_id is None else self._slot[lora_id] for lora_id in ids)
        for slot in reversed(list(dict.fromkeys(reversed(slots)))):  # each slot used, by its last request's place
            if slot != BASE_SLOT:
                self._lru.move_to_end(slot)
        return LoraBatch(slots, tuple(loads))

    def _set(self, slot: int, lora_id: str | None) -> None:
        old = self.holder[slot]
        if old is not None:
            del self._slot[old]
        self.holder[slot] = lora_id
        if lora_id is not None:
            self._slot[lora_id] = slot

    def release(self, lora_id: str) -> None:
        """The adapter is unloaded: its slot, if any, is free (and first to be reused)."""
        self.pinned.discard(lora_id)
        slot = self.slot_of(lora_id)
        if slot is not None:
            self._set(slot, None)
            self._lru.move_to_end(slot, last=False)
