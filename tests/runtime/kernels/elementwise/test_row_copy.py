"""copy_rows: every buffer's rows src_slots into rows dst_slots of its partner, in one launch per row size, for word
sizes 8, 4, 2 and 1 (bf16 rows, float8 rows, odd-byte rows), rows wider than a chunk, more tokens than a program
takes; the rows not named stay as they were. On the CPU under TRITON_INTERPRET=1 (a subprocess), on CUDA, and from
one GPU into another's buffers where two are there (the disaggregated prefill server's write)."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "row copy cases passed"


def run_cases(src_device: str, dst_device: str) -> None:
    from radixlm.runtime.kernels.elementwise import copy_rows

    g = torch.Generator().manual_seed(0)
    shapes = [((2, 64), torch.bfloat16), ((3, 100), torch.float16), ((300,), torch.float32),  # 300 words: 2 chunks
              ((5, 3), torch.uint8), ((7,), torch.float8_e4m3fn)]
    src, dst = [], []
    for row, dtype in shapes:
        for _ in range(2):  # K and V alike
            bits = torch.randint(0, 256, (40, *row, torch.empty((), dtype=dtype).element_size()), generator=g,
                                 dtype=torch.uint8)
            src.append(bits.view(dtype).reshape(40, *row).to(src_device))
            dst.append(torch.zeros(50, *row, dtype=dtype, device=dst_device))
    src_slots = torch.randperm(40, generator=g)[:21]  # 21 tokens: two programs of 16
    dst_slots = torch.randperm(50, generator=g)[:21]
    copy_rows(src, src_slots, dst, dst_slots)
    if src_device != "cpu":
        torch.cuda.synchronize()
    others = torch.ones(50, dtype=torch.bool)
    others[dst_slots] = False
    for a, b in zip(src, dst):
        a, b = a.cpu().view(torch.uint8), b.cpu().view(torch.uint8)
        assert torch.equal(b[dst_slots], a[src_slots]), a.shape
        assert not b[others].any()
    copy_rows(src[:1], src_slots[:0], dst[:1], dst_slots[:0])  # no tokens: nothing to do
    with pytest.raises(ValueError, match="source slots"):
        copy_rows(src[:1], src_slots, dst[:1], dst_slots[:3])
    with pytest.raises(ValueError, match="rows"):
        copy_rows(src[:1], src_slots, dst[2:3], dst_slots)
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs Triton's interpreter, no CUDA")
def test_row_copy_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_row_copy_cuda():
    run_cases("cuda", "cuda")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_row_copy_into_another_gpu():
    torch.empty(1, device="cuda:1").copy_(torch.zeros(1, device="cuda:0"))  # torch turns peer access on
    run_cases("cuda:0", "cuda:1")


if __name__ == "__main__":
    torch.set_num_threads(1)
    run_cases("cuda", "cuda") if torch.cuda.is_available() else run_cases("cpu", "cpu")
