"""The host pool's memory as the device sees it: page-locking it in place, and a CUDA tensor over the same bytes
(unified virtual addressing: a kernel reads and writes the pinned rows over the host link, SGLang's `kernel` I/O
backend), so a copy between the tiers is a gather kernel per layer or one scatter kernel, however scattered the host
slots are, instead of one DMA call per run of consecutive slots or a gather on the host."""
from __future__ import annotations

import logging

import numpy as np
import torch

logger = logging.getLogger(__name__)

_CUDA_HOST_REGISTER_MAPPED = 2  # cudaHostRegisterMapped: the pages are also mapped into the device's address space


def pin(t: torch.Tensor) -> bool:
    """Page-locks t's memory in place and maps it for the device (cudaHostRegister: pin_memory's allocator would
    round a large pool up to a power of two); whether it is."""
    ok, err = False, None
    for flags in (_CUDA_HOST_REGISTER_MAPPED, 0):  # unmapped, if mapping is refused: DMA copies still work
        try:
            err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), flags)
            ok = int(getattr(err, "value", err)) == 0
        except (AttributeError, RuntimeError, TypeError) as e:
            ok, err = False, e
        if ok:
            break
    if ok and not t.is_pinned():
        logger.warning("hierarchical cache: the host pool is registered but torch does not report it pinned")
    if not ok:
        logger.warning("hierarchical cache: the host pool could not be pinned (%s); it stays pageable and loads are "
                       "gathered through a pinned buffer", err)
    return ok


def raw(t: torch.Tensor) -> torch.Tensor:
    """Bytes-compatible view for indexing (torch's index kernels do not take every float8 dtype)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def contiguous_runs(sorted_slots: torch.Tensor) -> list[tuple[int, int, int]]:
    """(offset, first slot, length) of each maximal run of consecutive slots in an ascending 1-D CPU tensor."""
    n = sorted_slots.numel()
    if n == 0:
        return []
    a = sorted_slots.numpy()  # (numpy: a few times faster than torch's ops on index-sized arrays)
    starts = np.concatenate(([0], np.flatnonzero(a[1:] - a[:-1] != 1) + 1))
    return list(zip(starts.tolist(), a[starts].tolist(), np.diff(starts, append=n).tolist()))


def word_dtype(row_bytes: int) -> torch.dtype:
    """The widest integer a row of row_bytes splits into: a gather kernel then moves 8 bytes a thread (a warp reads
    256 contiguous bytes of host memory per request, not 64 as bf16 elements would)."""
    for dtype in (torch.int64, torch.int32, torch.int16):
        if row_bytes % dtype.itemsize == 0:
            return dtype
    return torch.uint8


def as_words(t: torch.Tensor, rows_dims: int) -> torch.Tensor:
    """A contiguous tensor's bytes as (*t.shape[:rows_dims], words) of word_dtype (a view, no copy)."""
    flat = t.view(torch.uint8).reshape(*t.shape[:rows_dims], -1)
    return flat.view(word_dtype(flat.shape[-1]))


class _CudaArray:
    """A device pointer in the CUDA array interface (torch.as_tensor wraps it without a copy)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}


def device_view(t: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """A CUDA tensor over the bytes of t (contiguous, pinned by `pin`, its first row free for a probe): t's shape
    with the last dimension in bytes; None, with a warning, where the device cannot address it (no UVA mapping) or a
    probe copy both ways does not round-trip."""
    nbytes = t.numel() * t.element_size()
    host = t.view(torch.uint8).reshape(t.shape[0], -1)
    try:
        with torch.cuda.device(device):
            view = torch.as_tensor(_CudaArray(t.data_ptr(), nbytes), device=device).view(host.shape)
        probe = (torch.arange(host.shape[1], dtype=torch.int64) * 7 % 251).to(torch.uint8)
        host[0].copy_(probe)
        torch.cuda.synchronize(device)
        read = view[0].clone()  # a device kernel reads the host row
        view[0].add_(1)  # and writes it
        torch.cuda.synchronize(device)
        ok = torch.equal(read.cpu(), probe) and torch.equal(host[0], probe + 1)
        host[0].zero_()
    except (RuntimeError, TypeError, ValueError) as e:
        logger.warning("hierarchical cache: the device cannot address the pinned host pool (%s); copies go through "
                       "DMA calls per run of host slots", e)
        return None
    if not ok:
        logger.warning("hierarchical cache: a device copy through the host pool's mapping did not round-trip; copies "
                       "go through DMA calls per run of host slots")
        return None
    if view.data_ptr() != t.data_ptr() or view.device.type != "cuda":
        return None
    return view
