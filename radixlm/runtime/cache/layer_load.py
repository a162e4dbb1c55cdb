"""LayerLoadWaiter: where a forward pass waits for KV loaded back into the device pool (the hierarchical cache's
host -> device loads, cache/hicache/host_pool.py).

The loads run on a copy stream layer by layer, in layer order, each layer's copies ending with an event. A pass
carries the events of the loads issued before it (ForwardBatch.layer_loads) and its attention of layer i waits for
layer i's event only (`wait`), before it stores or reads that layer's KV: layer i+1's KV arrives while layer i computes
(SGLang's HiCache loads layer by layer the same way). Events of one stream complete in order, so layer i's event also
covers every earlier layer and every earlier load; `wait_all` (the last layer's) covers them all."""
from __future__ import annotations

import torch


class LayerLoadWaiter:
    def __init__(self, events: list["torch.cuda.Event"]):
        if not events:
            raise ValueError("a layer load waiter needs one event per layer")
        self._events = events
        self._waited = 0  # layers [0, _waited) are ordered before the current stream's work

    @property
    def num_layers(self) -> int:
        return len(self._events)

    @property
    def done(self) -> bool:
        """Whether the current stream already waits for every layer."""
        return self._waited == len(self._events)

    def wait(self, layer_id: int) -> None:
        """Orders the current stream's next work after the loads of layers <= layer_id (a layer this pool does not
        know, e.g. a draft model's: after all of them). Once per layer; later calls cost nothing."""
        last = layer_id if 0 <= layer_id < len(self._events) else len(self._events) - 1
        if last < self._waited:
            return
        torch.cuda.current_stream().wait_event(self._events[last])
        self._waited = last + 1

    def wait_all(self) -> None:
        """Orders the current stream after every layer's load (a CUDA-graph replay, or the end of a pass)."""
        self.wait(len(self._events) - 1)

