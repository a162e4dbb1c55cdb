"""The batched LoRA segment kernels against the torch path (lora/ops.py) on a pass mixing slots and base rows,
segments of one row (decode's gather form) and longer than a block, widths and outputs that are not multiples of
the blocks; float32 and bfloat16. Run under TRITON_INTERPRET=1 in a subprocess (tests/triton_interpret.py), and
natively where CUDA is."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter


def run_cases(device: str) -> None:
    from radixlm.runtime.lora.ops import LoraBatchInfo, add_lora_delta, lora_delta_torch

    g = torch.Generator().manual_seed(0)
    for dtype, (slots, width, k, n), (req_slots, req_rows) in [
        # Segments of one row (decode's gather form) and one longer than a block.
        (torch.float32, (3, 24, 40, 40), ([1, -1, 0, 2, 0, 2], [3, 2, 1, 18, 1, 1])),
        (torch.bfloat16, (2, 48, 32, 24), ([1, -1], [3, 2])),
    ]:
        a = torch.randn(slots, width, k, generator=g).to(dtype).to(device)
        b = torch.randn(slots, n, width, generator=g).to(dtype).to(device)
        scalings = torch.tensor([0.5, 2.0, 1.5][:slots], device=device)
        info = LoraBatchInfo.build(req_slots, req_rows, scalings, device)
        x = torch.randn(sum(req_rows), k, generator=g).to(dtype).to(device)
        base = torch.randn(sum(req_rows), n, generator=g).to(dtype).to(device)
        want = base.float() + lora_delta_torch(x.float(), a.float(), b.float(), info)
        got = add_lora_delta(base.clone(), x, a, b, info, use_triton=True)  # kernels/lora's segment_lora_add
        # (not torch.testing.assert_close: its import of torch.distributed.tensor costs seconds)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        err = (got.float() - want).abs().max().item()
        assert err <= tol * want.abs().max().item(), (dtype, err)
        base_rows = info.row_slots < 0
        assert torch.equal(got[base_rows], base[base_rows])  # rows of the base model untouched


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_segment_kernels_under_interpreter():
    run_under_interpreter(__file__, "segment lora ok", hide_cuda=True, timeout=120)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_segment_kernels_on_cuda():
    run_cases("cuda")


if __name__ == "__main__":  # the interpreter run of test_segment_kernels_under_interpreter
    torch.set_num_threads(1)
    run_cases("cpu")
    print("segment lora ok")
