"""cache/zeroed.zeros on the CPU: zeros of the asked shape and dtype, writable, alive as long as the tensor is, and
paid for page by page as written (a KV pool of which a run writes a few slots touches only those pages)."""
from __future__ import annotations

import gc
import resource

import pytest
import torch

from radixlm.runtime.cache.memory_pool import ReqToTokenPool
from radixlm.runtime.cache.zeroed import zeros

CPU = torch.device("cpu")


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int64])
def test_zeros_of_the_shape_and_dtype_writable(dtype):
    t = zeros((3, 5, 7), dtype, CPU)
    assert t.shape == (3, 5, 7) and t.dtype == dtype and t.is_contiguous() and t.device == CPU
    assert not t.view(torch.uint8).any()
    t.view(torch.uint8)[1, 2].fill_(7)
    assert int(t.view(torch.uint8).sum()) == 7 * 7 * dtype.itemsize


def test_the_memory_lives_as_long_as_the_tensor_and_its_views():
    t = zeros((4, 1024), torch.float32, CPU)
    view = t[2]
    del t
    gc.collect()
    view.fill_(2.0)
    assert float(view.sum()) == 2.0 * 1024


def test_empty_shapes():
    assert zeros((0, 8), torch.float32, CPU).shape == (0, 8)


def test_pages_are_touched_only_when_written():
    before = minor_faults()
    t = zeros((64, 1 << 20), torch.float32, CPU)  # 256 MiB: 65,536 pages of 4 KiB
    t[0].fill_(1.0)  # 4 MiB
    t[-1, :16].fill_(1.0)
    faults = minor_faults() - before
    # torch.zeros would write (and fault in) every page; here only what was written, and a margin for the rest of
    # the process.
    assert faults < 8_000, faults
    assert float(t.sum()) == (1 << 20) + 16


def test_the_request_table_starts_zeroed():
    pool = ReqToTokenPool(4, 16)
    assert pool.req_to_token.shape == (4, 16) and not pool.req_to_token.any()
