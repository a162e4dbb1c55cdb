"""Releasing and resuming a model runner's memory (/release_memory_occupation, /resume_memory_occupation with
--enable-memory-saver), by SGLang's tags: `kv_cache` (the KV pool) and `weights` (the model's parameters).

Released, the KV pool's buffers are freed (their content is lost: the radix cache is flushed first) and each weight
moves to host memory (on the CPU the model lets go of it and it is kept aside); resumed, they come back, the KV pool
zeroed, and the CUDA graphs, which read the old addresses, are captured again. (SGLang's torch_memory_saver keeps the
virtual addresses instead; it needs its CUDA build preloaded into the process, which radixlm does not assume.)"""
from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Iterable

import torch

logger = logging.getLogger(__name__)


class MemoryTag(enum.Enum):
    KV_CACHE = "kv_cache"
    WEIGHTS = "weights"


def parse_tags(tags: Iterable[str] | None) -> frozenset[MemoryTag]:
    """None: every tag; a ValueError names an unknown one."""
    if tags is None:
        return frozenset(MemoryTag)
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise ValueError("tags must be a list of strings")
    known = {t.value: t for t in MemoryTag}
    unknown = [t for t in tags if t not in known]
    if unknown:
        raise ValueError(f"unknown memory tag(s) {unknown}; choose from {sorted(known)}")
    if not tags:
        raise ValueError("tags must not be empty (omit it for all of them)")
    return frozenset(known[t] for t in tags)


def prepare_allocator(device: str) -> bool:
    """With --enable-memory-saver on CUDA, before the model loads: the caching allocator maps its segments in pieces
    (expandable segments), so that once released its empty_cache unmaps all but the pages of the few tensors that stay
    (request tables, the sampler's buffers). With whole segments those tensors pinned ~1 GiB of freed blocks (H200,
    Llama-3.1-8B shapes: 1.54 GiB above the CUDA context while released; expandable, 0.56: docs/weights.md). A
    PYTORCH_CUDA_ALLOC_CONF that names expandable_segments is left as the user set it. True: the setting was applied."""
    if torch.device(device).type != "cuda" or "expandable_segments" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return False
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    return True


class MemorySaver:
    """One ModelRunner's release and resume. Its owner (the scheduler) makes sure nothing runs while released."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.released: set[MemoryTag] = set()
        self._host: list[tuple[torch.nn.Parameter, torch.Tensor]] = []

    def release(self, tags: frozenset[MemoryTag]) -> frozenset[MemoryTag]:
        """Releases those of tags still held; returns them."""
        todo = frozenset(tags - self.released)
        if not todo:
            return todo
        t0 = time.perf_counter()
        self.runner.release_cuda_graphs()
        # The last pass's hidden states: after a replay a view of its graph's static buffer, which would keep that
        # graph's memory pool reserved while released.
        self.runner.last_hidden = None
        if MemoryTag.KV_CACHE in todo:
            self.runner.token_to_kv_pool.release()
        if MemoryTag.WEIGHTS in todo:
            self._release_weights()
        self.released |= todo
        if self.runner.is_cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        logger.info("released %s in %.2f s%s", sorted(t.value for t in todo), time.perf_counter() - t0,
                    _gpu_usage(self.runner))
        return todo

    def resume(self, tags: frozenset[MemoryTag]) -> frozenset[MemoryTag]:
        """Brings back those of tags that are released; returns them. Graphs are captured again once nothing is."""
        todo = frozenset(tags & self.released)
        if not todo:
            return todo
        t0 = time.perf_counter()
        if MemoryTag.WEIGHTS in todo:
            self._resume_weights()
        if MemoryTag.KV_CACHE in todo:
            self.runner.token_to_kv_pool.resume()
        self.released -= todo
        if not self.released:
            self.runner.capture_cuda_graphs()
        logger.info("resumed %s in %.2f s%s", sorted(t.value for t in todo), time.perf_counter() - t0,
                    _gpu_usage(self.runner))
        return todo

    def _release_weights(self) -> None:
        seen: set[int] = set()
        on_cuda = self.runner.is_cuda
        self.runner.unpack_weights()
        for module in self.runner.model.modules():
            for p in module.parameters(recurse=False):
                if id(p) in seen:  # tied weights: one parameter
                    continue
                seen.add(id(p))
                host = p.data.to("cpu", non_blocking=False).pin_memory() if on_cuda else p.data
                self._host.append((p, host))
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _resume_weights(self) -> None:
        device = torch.device(self.runner.device)
        for p, host in self._host:
            p.data = host.to(device) if device.type != "cpu" else host
        self._host = []
        self.runner.refresh_weights()


def _gpu_usage(runner) -> str:
    if not runner.is_cuda:
        return ""
    free, total = torch.cuda.mem_get_info()
    return f"; GPU memory in use {(total - free) / 2**30:.2f} GiB"
