"""kernels/numerics.div_rn_f32 against torch's float32 division, bit for bit: on CUDA (the hardware's float64), and
on the CPU under TRITON_INTERPRET=1 (numpy's IEEE float64 and rounding to float32, so the argument in its docstring
is tested, not just one GPU): quotients of random significands over wide exponent ranges, exact quotients, values
one float32 step off them, and huge and tiny quotients."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.numerics import div_rn_f32
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "div_rn_f32 cases passed"


def _cases(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    scales = torch.exp2(torch.empty(rows).uniform_(-20, 20, generator=g)) * torch.empty(rows).uniform_(1, 2, generator=g)
    x = torch.exp2(torch.empty(rows, width).uniform_(-30, 30, generator=g)) * torch.empty(rows, width).uniform_(
        -2, 2, generator=g)
    q = torch.randint(-2**24, 2**24, (rows, width // 4), generator=g).float() * torch.exp2(
        torch.randint(-30, 10, (rows, 1), generator=g).float())
    exact = q * scales[:, None]  # float32 products: their quotients by the scale sit on or next to representable values
    x[:, : width // 4] = exact
    x[:, width // 4 : width // 2] = torch.nextafter(exact, torch.full_like(exact, float("inf")))
    x[:, width // 2 - 4 : width // 2] = torch.tensor([3e38, -3e38, 1e-38, 0.0])
    return x.float(), scales.float()


@triton.jit
def _div_rows(X, S, Out, WIDTH: tl.constexpr):
    row = tl.program_id(0)
    offs = row * WIDTH + tl.arange(0, WIDTH)
    tl.store(Out + offs, div_rn_f32(tl.load(X + offs), tl.load(S + row)))


def run_cases(device: str) -> None:
    rows, width = (64, 1024) if device == "cpu" else (1024, 4096)
    x, scales = _cases(rows, width)
    x, scales = x.to(device), scales.to(device)
    out = torch.empty_like(x)
    _div_rows[(rows,)](x, scales, out, WIDTH=width)
    want = x / scales[:, None]
    bad = (out.view(torch.int32) != want.view(torch.int32)).sum().item()
    assert bad == 0, f"{bad} of {x.numel()} quotients differ"
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs Triton's interpreter, no CUDA")
def test_div_rn_f32_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_div_rn_f32_cuda():
    run_cases("cuda")


if __name__ == "__main__":
    torch.set_num_threads(1)
    run_cases("cuda" if torch.cuda.is_available() else "cpu")
