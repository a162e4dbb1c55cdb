"""oneDNN-packed CPU weights: the packed copy is a layer's only one, gives F.linear's results on the original weight,
refuses writes, and comes back bit for bit when unpacked (weight updates, the memory saver)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.kernels.gemm import cpu_gemm
from radixlm.runtime.layers.linear import Linear

pytestmark = pytest.mark.skipif(cpu_gemm.pack_weight(torch.ones(2, 2)) is None, reason="no oneDNN packing here")


def _linear(k: int, n: int, bias: bool = True) -> tuple[Linear, torch.Tensor]:
    torch.manual_seed(0)
    lin = Linear(k, n, bias=bias)
    lin.weight.data.normal_(0, k**-0.5)
    if bias:
        lin.bias.data.normal_()
    return lin, lin.weight.detach().clone()


def test_a_packed_layer_holds_one_copy_and_computes_as_the_plain_weight():
    lin, plain = _linear(256, 96)
    lin.pack_for_cpu()
    assert lin.packed_weight is not None
    assert cpu_gemm.is_placeholder(lin.weight) and lin.weight.untyped_storage().nbytes() == 4
    assert lin.weight.shape == (96, 256) and lin.weight.dtype == torch.float32
    for x in (torch.randn(5, 256), torch.randn(2, 3, 256), torch.randn(0, 256), torch.randn(256, 7).t(),
              torch.randn(256)):
        got = lin(x)
        assert got.shape == (*x.shape[:-1], 96)
        assert torch.allclose(got, F.linear(x, plain, lin.bias), atol=1e-5)
    assert torch.equal(lin.dense_weight(), plain)


def test_a_packed_weight_refuses_writes_until_unpacked():
    lin, plain = _linear(64, 32, bias=False)
    lin.pack_for_cpu()
    with pytest.raises(RuntimeError, match="single memory location"):
        lin.weight.data.copy_(torch.zeros(32, 64))
    lin.unpack_for_cpu()
    assert lin.packed_weight is None and torch.equal(lin.weight, plain)
    lin.weight.data.mul_(2)
    lin.pack_for_cpu()
    x = torch.randn(3, 64)
    assert torch.allclose(lin(x), F.linear(x, 2 * plain), atol=1e-5)


def test_packing_twice_keeps_the_packed_weight():
    lin, plain = _linear(64, 32)
    lin.pack_for_cpu()
    packed = lin.packed_weight
    lin.pack_for_cpu()  # a refresh with nothing unpacked: the placeholder is never packed
    assert lin.packed_weight is packed and torch.equal(lin.dense_weight(), plain)


def test_a_packed_weight_takes_only_float32_inputs():
    lin, _ = _linear(64, 32)
    lin.pack_for_cpu()
    with pytest.raises(TypeError, match="float32"):
        lin(torch.randn(2, 64, dtype=torch.bfloat16))


def test_other_dtypes_are_not_packed():
    lin = Linear(64, 32)
    lin.weight.data = torch.randn(32, 64, dtype=torch.bfloat16)
    lin.pack_for_cpu()
    assert lin.packed_weight is None and not cpu_gemm.is_placeholder(lin.weight)
