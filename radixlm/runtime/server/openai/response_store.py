"""The bounded in-memory store of /v1/responses objects (`store: true`): GET and DELETE by id, and the conversation
a `previous_response_id` continues. Least recently used first out beyond --responses-store-size; nothing survives a
restart. One per app (app.state), used from the event loop only."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.server.openai.protocol import ChatMessage


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the Response object as it was returned
    # The conversation as chat messages after this response: the turns it continued, its input, its output.
    # Its instructions are not part of it (OpenAI does not carry them over to a continuation).
    history: tuple[ChatMessage, ...]


class ResponseStore:
    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"responses store size must be >= 0, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.capacity == 0:
            return
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None
