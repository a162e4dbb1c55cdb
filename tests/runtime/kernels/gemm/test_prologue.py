"""A GEMM's prologue (kernels/gemm/prologue.py) on the paths that run it unfused: the linear layer's output and the new
residual are those of the step's module followed by the plain GEMM."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.kernels.gemm.prologue import PrologueKind
from radixlm.runtime.layers.activation import SiluAndMul
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.norm import RMSNorm


def _linear(k: int, n: int) -> Linear:
    lin = Linear(k, n, bias=True)
    lin.weight.data.normal_(0, k**-0.5)
    lin.bias.data.normal_()
    lin.pack_for_cpu()
    return lin


@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_prologue_equals_norm_then_linear(with_residual):
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data.normal_(1.0, 0.1)
    lin = _linear(64, 32)
    x, res = torch.randn(5, 64), torch.randn(5, 64)
    pro = norm.prologue(res if with_residual else None)
    assert pro.kind is (PrologueKind.ADD_RMSNORM if with_residual else PrologueKind.RMSNORM)
    got = lin(x, pro)
    if with_residual:
        normed, new_res = norm(x, res)
        assert torch.equal(pro.residual_out, new_res)
    else:
        normed = norm(x)
        assert pro.residual_out is None
    assert torch.equal(got, lin(normed))
    assert torch.allclose(got, F.linear(normed, lin.dense_weight(), lin.bias), atol=1e-5)


def test_silu_prologue_takes_the_doubled_input():
    torch.manual_seed(1)
    act, lin = SiluAndMul(), _linear(48, 16)
    x = torch.randn(3, 96)
    pro = act.prologue()
    assert pro.in_features(x) == 48
    assert torch.equal(lin(x, pro), lin(act(x)))


def test_a_prologue_copy_keeps_its_own_residual_out():
    norm = RMSNorm(8)
    norm.weight.data.fill_(1.0)
    pro = norm.prologue(torch.ones(2, 8))
    copy = dataclasses.replace(pro)
    copy.apply(torch.zeros(2, 8))
    assert pro.residual_out is None and torch.equal(copy.residual_out, torch.ones(2, 8))


def test_a_kernel_fits_the_step_only_on_inputs_it_reads_in_place():
    norm = RMSNorm(8)
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    norm.weight.data = torch.ones(8, dtype=torch.bfloat16)
    assert norm.prologue().fits(x) and norm.prologue(torch.zeros(2, 8, dtype=torch.bfloat16)).fits(x)
    assert not norm.prologue(torch.zeros(3, 8, dtype=torch.bfloat16)).fits(x)  # the residual's rows
    assert not norm.prologue(torch.zeros(2, 8)).fits(x)  # the residual's dtype
    assert not norm.prologue(torch.zeros(2, 16, dtype=torch.bfloat16)[:, ::2]).fits(x)  # its column stride
    norm.weight.data = torch.ones(8)
    assert not norm.prologue().fits(x)  # the weight's dtype
    norm.weight.data = torch.ones(16, dtype=torch.bfloat16)[::2]
    assert not norm.prologue().fits(x)  # a strided weight
    assert SiluAndMul().prologue().fits(torch.zeros(2, 16, dtype=torch.bfloat16))
