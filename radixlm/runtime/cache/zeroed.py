"""Zero-filled buffers that cost nothing until written: on the CPU, a private anonymous mapping, which the kernel
backs with zeroed pages on first touch, so a KV pool or request table of which a run writes a few thousand slots
touches only those pages. torch.zeros writes every byte at once: 1.2 GB for the CPU's default pool, and on a VM
whose first touches cost 20-40 us a page (docs/performance.md, "First touches of memory on the CPU VM") seconds of
start-up. Elsewhere (CUDA) torch.zeros."""
from __future__ import annotations

import math
import mmap

import torch


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous tensor of zeros; on the CPU its pages are mapped as they are first written (the tensor holds the
    mapping, released with its storage)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buf, dtype=dtype).view(shape)
