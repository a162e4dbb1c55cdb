"""The fused all-reduce + residual add + RMSNorm kernel against the unfused steps. Under TRITON_INTERPRET=1 two ranks
share one process and run one after the other: before rank 0's call, rank 1's half of the exchange (its row in its
slot, its signal) is put in place as if it had arrived first; rank 1's call then finds rank 0's. Two calls check the
slot alternation and that every signal is consumed once. Float32 there: the interpreter truncates where a GPU
rounds a float32 to bf16. On two GPUs the communicator's own probe and a model-sized
case run for real (benchmarks and tests/runtime/distributed cover it there)."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "allreduce rmsnorm cases passed"


def reference(parts, residual, weight, eps):
    s = parts[0].float()
    for p in parts[1:]:
        s = s + p.float()
    h = (s.to(parts[0].dtype).float() + residual.float()).to(parts[0].dtype)
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return weight * normed, h


def run_cases() -> None:
    from radixlm.runtime.kernels.elementwise.allreduce_rmsnorm import MAX_ROWS, ArNormLayout, allreduce_add_rmsnorm

    g = torch.Generator().manual_seed(0)
    world, h, eps = 2, 96, 1e-6  # h not a power of two: the masked tail
    layout = ArNormLayout(world, 1 << 20)
    bufs = [torch.zeros(layout.buffer_bytes, dtype=torch.uint8) for _ in range(world)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    epochs = [torch.zeros(MAX_ROWS, dtype=torch.int32) for _ in range(world)]
    weight = torch.randn(h, generator=g)

    def counters(rank):
        return bufs[rank][: layout.flag_bytes].view(torch.int32).view(MAX_ROWS, world)

    def data(rank, slot, rows):
        start = layout.data_offset + slot * layout.slot_bytes
        return bufs[rank][start : start + rows * h * 4].view(torch.float32).view(rows, h)

    for call, rows in enumerate((3, 3)):
        parts = [torch.randn(rows, h, generator=g) for _ in range(world)]
        residual = torch.randn(rows, h, generator=g)
        want_out, want_res = reference(parts, residual, weight, eps)
        data(1, call % 2, rows).copy_(parts[1])  # rank 1 arrived first
        counters(0)[:rows, 1] += 1
        for rank in range(world):
            out, res = allreduce_add_rmsnorm(parts[rank], residual, weight, eps, ptrs, epochs[rank], rank, layout)
            assert torch.equal(res, want_res), (call, rank)
            torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6)
        assert torch.equal(data(0, call % 2, rows), parts[0]) and torch.equal(data(1, call % 2, rows), parts[1])
        # rank 1's real signal to rank 0 stands in for the one put in place: taking it back leaves every count at 0
        assert torch.equal(counters(0)[:rows, 1], torch.ones(rows, dtype=torch.int32))
        counters(0)[:rows, 1] -= 1
        assert not counters(0).any() and not counters(1).any()
        assert torch.equal(epochs[0][:rows], torch.full((rows,), call + 1, dtype=torch.int32))
    assert layout.max_rows(h * 4) == MAX_ROWS and ArNormLayout(2, 1 << 20).max_rows(8192) < MAX_ROWS
    assert layout.max_rows(6) == 0  # rows of 3 halves: not whole 16-byte vectors
    with pytest.raises(ValueError, match="do not fit"):
        allreduce_add_rmsnorm(torch.zeros(MAX_ROWS + 1, h), torch.zeros(MAX_ROWS + 1, h),
                              weight, eps, ptrs, epochs[0], 0, layout)
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs Triton's interpreter, no CUDA")
def test_allreduce_rmsnorm_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True)


if __name__ == "__main__":
    run_cases()
