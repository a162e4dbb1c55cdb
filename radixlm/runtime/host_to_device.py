"""Host -> device copies that never wait for the device.

torch.tensor(values, device="cuda") copies from pageable memory and then synchronizes the stream, so the host
would wait for every kernel already queued: the overlap scheduler could not prepare a batch while the previous one
runs. These helpers stage through pinned memory and enqueue the copy on the current stream instead."""
from __future__ import annotations

from typing import Sequence

import torch


def host_to_device(values: Sequence | torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    device = torch.device(device)
    if device.type != "cuda":
        t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
        return t.to(device=device, dtype=dtype)
    if isinstance(values, torch.Tensor):
        t = values.to(dtype).pin_memory()
    else:
        t = torch.tensor(values, dtype=dtype, pin_memory=True)  # built in pinned memory: no extra host copy
    # The caching host allocator keeps the pinned block alive until the copy has run.
    return t.to(device, non_blocking=True)


class HostCopy:
    """Tensors copied to the host without waiting for the device (on CUDA the copies are enqueued after the work
    that produces them); `get` waits for the copies, once."""

    def __init__(self, *tensors: torch.Tensor):
        self._done = None
        if tensors and tensors[0].is_cuda:
            tensors = tuple(t.to("cpu", non_blocking=True) for t in tensors)
            self._done = torch.cuda.Event()
            self._done.record()
        self._tensors = tensors

    def get(self) -> tuple[torch.Tensor, ...]:
        if self._done is not None:
            self._done.synchronize()
            self._done = None
        return self._tensors


def rows_to_device(rows: Sequence[Sequence[int]], device: torch.device | str) -> torch.Tensor:
    """Several equal-length int64 vectors in one copy: returns a (len(rows), n) device tensor."""
    return host_to_device(rows, torch.int64, device).reshape(len(rows), -1)
