"""prepare_allocator: expandable segments on CUDA with --enable-memory-saver, unless the user's allocator config names
them; nothing on the CPU."""
from __future__ import annotations

import torch

from radixlm.runtime.executor import memory_saver


def test_expandable_segments_on_cuda_only_and_the_users_setting_wins(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert not memory_saver.prepare_allocator("cpu")
    assert calls == []
    assert memory_saver.prepare_allocator("cuda:0")
    assert calls == ["expandable_segments:True"]
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert not memory_saver.prepare_allocator("cuda")
    assert calls == ["expandable_segments:True"]
