"""The fused all-reduce + residual add + RMSNorm kernel against the unfused steps. Under TRITON_INTERPRET=1 the ranks
(two, then four) share one process and run one after the other (`exchange`). Three calls check the slot alternation
and that every slot read is left empty; a partial whose bits are the empty pattern still arrives (as a NaN). Float32
there: the interpreter truncates where a GPU rounds a float32 to bf16. On two GPUs the communicator's own probe and a
model-sized case run for real (benchmarks and tests/runtime/distributed cover it there)."""
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


def exchange(world: int, g: torch.Generator) -> None:
    """Three calls among `world` ranks run one after another: before rank r's call, the partials of the ranks after
    it are put in its slot as if they had arrived first; their real sends, which land after r has read and emptied
    the slot, are checked and taken back."""
    from radixlm.runtime.kernels.elementwise.allreduce_rmsnorm import (
        EMPTY_BYTE, MAX_ROWS, ArNormLayout, allreduce_add_rmsnorm)

    h, eps = 96, 1e-6  # h not a power of two: the masked tail
    layout = ArNormLayout(world, 1 << 20)
    bufs = [torch.full((layout.buffer_bytes,), EMPTY_BYTE, dtype=torch.uint8) for _ in range(world)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    epochs = [torch.zeros(MAX_ROWS, dtype=torch.int32) for _ in range(world)]
    weight = torch.randn(h, generator=g)

    def received(rank, sender, slot, rows):
        """rank's slot rows from sender (slot rows are (row, sender) pairs)."""
        start = slot * layout.slot_bytes
        rows_of_all = bufs[rank][start : start + rows * world * h * 4].view(torch.float32).view(rows, world, h)
        return rows_of_all[:, sender]

    for call, rows in enumerate((3, 3, 2)):
        parts = [torch.randn(rows, h, generator=g) for _ in range(world)]
        if call == 2:  # the empty pattern as data: sent as another NaN, so the receiver does not wait forever
            parts[0][1, 5] = torch.tensor(-1, dtype=torch.int32).view(torch.float32)
        residual = torch.randn(rows, h, generator=g)
        want_out, want_res = reference(parts, residual, weight, eps)
        slot = call % 2
        for rank in range(world):
            for sender in range(rank + 1, world):
                received(rank, sender, slot, rows).copy_(parts[sender])
        for rank in range(world):
            out, res = allreduce_add_rmsnorm(parts[rank], residual, weight, eps, ptrs, epochs[rank], rank, layout)
            torch.testing.assert_close(res, want_res, rtol=0, atol=0, equal_nan=True, msg=f"{world} {call} {rank}")
            torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6, equal_nan=True)
        if call == 2:
            assert res[1, 5].isnan() and res[1].isfinite().sum() == h - 1
        for rank in range(world):
            for sender in range(rank + 1, world):
                torch.testing.assert_close(received(rank, sender, slot, rows), parts[sender], rtol=0, atol=0)
                received(rank, sender, slot, rows).view(torch.uint8).fill_(EMPTY_BYTE)
        assert all(bool((b == EMPTY_BYTE).all()) for b in bufs), (world, call)  # every slot read was emptied
        assert torch.equal(epochs[0][:rows], torch.full((rows,), call + 1 if rows == 3 else 3, dtype=torch.int32))


def run_cases() -> None:
    from radixlm.runtime.kernels.elementwise.allreduce_rmsnorm import MAX_ROWS, ArNormLayout, allreduce_add_rmsnorm

    g = torch.Generator().manual_seed(0)
    for world in (2, 4):
        exchange(world, g)
    layout = ArNormLayout(2, 1 << 20)
    assert layout.max_rows(96 * 4) == MAX_ROWS and layout.max_rows(8192) < MAX_ROWS
    assert ArNormLayout(2, 8 << 20).max_rows(4096 * 2) == 256 and ArNormLayout(4, 8 << 20).max_rows(4096 * 2) == 128
    assert layout.max_rows(6) == 0  # rows of 3 halves: not whole 16-byte vectors
    with pytest.raises(ValueError, match="do not fit"):
        allreduce_add_rmsnorm(torch.zeros(MAX_ROWS + 1, 96), torch.zeros(MAX_ROWS + 1, 96), torch.ones(96), 1e-6,
                              torch.zeros(2, dtype=torch.int64), torch.zeros(MAX_ROWS, dtype=torch.int32), 0, layout)
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs Triton's interpreter, no CUDA")
def test_allreduce_rmsnorm_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True)


if __name__ == "__main__":
    run_cases()
