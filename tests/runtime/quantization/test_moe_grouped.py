"""The MoE methods' wiring to the grouped quantized kernels (kernels/moe/quant_moe.py): a FusedMoE with dummy weights
in each format, loaded and processed as the loader does, computed by the grouped kernels on the method's
grouped_experts (its tensors as loaded) against the method's own CPU path (dequantize, then the float experts); under
TRITON_INTERPRET=1 in a subprocess (the device check forced: CPU tensors). On CPU the methods keep the dequantizing
path: checked in-process."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "grouped moe wiring passed"


def _layer(method, e=4, k=2, h=64, i=32, seed=0, parallel=None):
    from radixlm.runtime.distributed.parallel import SINGLE
    from radixlm.runtime.layers.moe import FusedMoE

    moe = FusedMoE(e, k, h, i, True, parallel or SINGLE)
    moe.quant_method = method
    method.create_weights(moe)
    g = torch.Generator().manual_seed(seed)
    method.init_dummy(moe, lambda pname, sid, shape: torch.randn(shape, generator=g) * 0.1)
    method.process_weights_after_loading(moe)
    return moe


def _methods():
    from radixlm.runtime.quantization.fp8 import ActivationScheme, Fp8Granularity, Fp8MoEMethod, Fp8Scheme
    from radixlm.runtime.quantization.int4_formats import AWQFormat, GPTQFormat
    from radixlm.runtime.quantization.int4_method import Int4MoEMethod
    from radixlm.runtime.quantization.int8 import Int8MoEMethod, Int8Scheme

    return {
        "fp8 tensor static": Fp8MoEMethod(Fp8Scheme(Fp8Granularity.TENSOR, ActivationScheme.STATIC)),
        "fp8 channel": Fp8MoEMethod(Fp8Scheme(Fp8Granularity.CHANNEL)),
        "fp8 block": Fp8MoEMethod(Fp8Scheme(Fp8Granularity.BLOCK, block=(32, 32), scale_name="weight_scale_inv")),
        "gptq act-order": Int4MoEMethod(GPTQFormat(v1=True, act_order=True, symmetric=True), 16),
        "awq": Int4MoEMethod(AWQFormat(), 32),
        "int8": Int8MoEMethod(Int8Scheme()),
    }


def run_cases() -> None:
    from radixlm.runtime.kernels.moe import quant_moe, select_experts
    from radixlm.runtime.kernels.moe.quant_moe_ref import fused_experts_quant_reference
    from tests.runtime.kernels.moe.quant_moe_cases import rel_err
    from tests.runtime.kernels.quant.test_quant_kernels_interpreted import patch_interpreter_fp8_rounding

    patch_interpreter_fp8_rounding()
    quant_moe.grouped_supported = lambda *a: True
    for n, (name, method) in enumerate(_methods().items()):
        moe = _layer(method, seed=n)
        experts = method.grouped_experts(moe, torch.float32, torch.device("cuda"))
        assert experts is not None, name
        g = torch.Generator().manual_seed(n)
        x = torch.randn(6, 64, generator=g)
        weights, ids = select_experts(torch.randn(6, 4, generator=g), 2, renormalize=True)
        got = quant_moe.fused_experts_quant(x, *experts, weights, ids)
        want = method.apply(moe, x, weights, ids)  # CPU: the dequantizing path
        assert rel_err(got, want) < 1e-4, (name, rel_err(got, want))
        assert rel_err(fused_experts_quant_reference(x, *experts, weights, ids), want) < 1e-6, name
        if name.startswith("fp8"):  # w8a8 (prefill) on the same tensors, static input scale included
            xh = x.half()
            got = quant_moe.fused_experts_quant(xh, *experts, weights, ids, w8a8=True)
            assert rel_err(got, fused_experts_quant_reference(xh, *experts, weights, ids, w8a8=True)) < 1e-2, name
    print(MARKER)


def test_methods_keep_the_dequantizing_path_on_cpu(monkeypatch):
    """CPU tensors never reach the grouped kernels (kernels.moe.quant_moe is not even imported for them)."""
    from radixlm.runtime.quantization.base import DequantizingMoEMethod

    for name, method in _methods().items():
        moe = _layer(method)
        calls = []
        monkeypatch.setattr(type(method), "grouped_experts", lambda *a, calls=calls: calls.append(a))
        x = torch.randn(3, 64)
        out = moe(x, torch.randn(3, 4))
        assert out.shape == x.shape and not calls and isinstance(method, DequantizingMoEMethod), name


def test_grouped_experts_needs_cuda():
    from radixlm.runtime.kernels.moe.quant_moe import grouped_supported

    for method in _methods().values():
        moe = _layer(method)
        assert method.grouped_experts(moe, torch.bfloat16, torch.device("cpu")) is None
    assert not grouped_supported(None, None, torch.float64, torch.device("cpu"))


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs triton's interpreter, no CUDA")
def test_methods_grouped_kernels_match_their_cpu_path_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=300)


if __name__ == "__main__":
    torch.set_num_threads(1)
    run_cases()
