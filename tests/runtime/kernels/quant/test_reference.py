"""kernels/quant/reference.py (the layouts and the CPU path) and the device dispatch of fp8_linear / int4_linear on
CPU: quantize / dequantize round trips, INT4 packing on known values, scale shapes, activation quantization,
errors."""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.kernels import quant
from radixlm.runtime.kernels.quant import reference as ref
from radixlm.runtime.kernels.quant import tiles


def test_pack_int4_known_values_and_round_trip():
    q = torch.arange(16).reshape(8, 2) % 16  # column 0: 0, 2, .., 14; column 1: 1, 3, .., 15
    packed = ref.pack_int4(q)
    assert packed.shape == (1, 2) and packed.dtype == torch.int32
    want0 = sum(v << (4 * i) for i, v in enumerate(range(0, 16, 2)))
    want1 = sum(v << (4 * i) for i, v in enumerate(range(1, 16, 2)))
    assert packed[0, 0].item() == want0 - 2**32 * (want0 >= 2**31)
    assert packed[0, 1].item() == want1 - 2**32 * (want1 >= 2**31)  # top nibble 15: a negative int32
    assert torch.equal(ref.unpack_int4(packed), q.to(torch.uint8))
    big = torch.randint(0, 16, (64, 24))
    assert torch.equal(ref.unpack_int4(ref.pack_int4(big)), big.to(torch.uint8))
    with pytest.raises(ValueError, match="multiple of 8"):
        ref.pack_int4(torch.zeros(12, 4, dtype=torch.int64))


@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_round_trip_within_half_a_step(symmetric):
    w = torch.randn(48, 256) * 0.1
    qw, scales, zeros = ref.quant_int4(w, 64, symmetric=symmetric)
    assert qw.shape == (32, 48) and scales.shape == zeros.shape == (4, 48)
    if symmetric:
        assert torch.all(zeros == 8)
    back = ref.dequant_int4(qw, scales, zeros, 64)
    step = scales.repeat_interleave(64, 0).t()
    assert torch.all((back - w).abs() <= step * 0.5 + 1e-6)
    with pytest.raises(ValueError, match="group size"):
        ref.quant_int4(w, 100)


@pytest.mark.parametrize("byteorder", ["little", "big"])
@pytest.mark.parametrize("k, group", [(256, 64), (96, 64), (128, 128)])
def test_dequant_int4_is_the_elementwise_definition(k, group, byteorder, monkeypatch):
    monkeypatch.setattr(sys, "byteorder", byteorder)  # "big": the nibble-shifting unpack
    g = torch.Generator().manual_seed(k + group)
    q = torch.randint(0, 16, (k, 24), generator=g)
    scales = torch.rand(-(-k // group), 24, generator=g).to(torch.bfloat16)
    zeros = torch.randint(0, 16, scales.shape, generator=g).to(torch.bfloat16)
    rows = torch.arange(k) // group
    want = ((q.float() - zeros.float()[rows]) * scales.float()[rows]).t()
    assert torch.equal(ref.dequant_int4(ref.pack_int4(q), scales, zeros, group), want)
    assert torch.equal(ref.dequant_int4(ref.pack_int4(q), scales, zeros, group, torch.bfloat16), want.bfloat16())


def test_int4_linear_gathers_act_order_channels():
    w = torch.randn(16, 64)
    qw, s, z = ref.quant_int4(w, 32)
    perm = torch.randperm(64)
    x = torch.randn(3, 64)
    want = F.linear(x[:, perm], ref.dequant_int4(qw, s, z, 32))
    torch.testing.assert_close(quant.int4_linear(x, qw, s, z, 32, perm), want)
    b = torch.randn(16)
    torch.testing.assert_close(quant.int4_linear(x.reshape(1, 3, 64), qw, s, z, 32, None, b),
                               (F.linear(x, ref.dequant_int4(qw, s, z, 32)) + b).reshape(1, 3, 16))


@pytest.mark.parametrize("block,per_channel,shape", [(None, False, ()), (None, True, (40,)), ((16, 32), False, (3, 3))])
def test_fp8_scale_shapes_and_round_trip(block, per_channel, shape):
    w = torch.randn(40, 80)
    q, s = ref.quant_fp8(w, block=block, per_channel=per_channel)
    assert q.dtype == ref.FP8_DTYPE and tuple(s.shape) == shape == ref.fp8_scale_shape(40, 80, block, per_channel)
    back = ref.dequant_fp8(q, s, block)
    assert (back - w).abs().max() <= w.abs().max() * 2**-4  # e4m3: 3 mantissa bits
    x = torch.randn(5, 80)
    torch.testing.assert_close(quant.fp8_linear(x, q, s, block), F.linear(x, back))


def test_activation_quantization_per_token_group_and_static():
    x = torch.randn(4, 300) * 5
    x[1] = 0
    q, s = ref.quant_fp8_act(x)
    assert s.shape == (4, 1) and s[1, 0] == pytest.approx(ref.ACT_EPS / ref.FP8_MAX)
    assert torch.equal(q[1].float(), torch.zeros(300))
    assert q.float().abs().amax(dim=1)[0] == ref.FP8_MAX  # each row's largest value lands on FP8_MAX
    back = ref.dequant_fp8_act(q, s)
    assert (back - x).abs().max() <= x.abs().max() * 2**-4
    qg, sg = ref.quant_fp8_act(x, group=128)
    assert sg.shape == (4, 3)  # 300 channels: groups of 128, 128, 44
    torch.testing.assert_close(sg[:, 2], x[:, 256:].abs().amax(dim=1).clamp(min=ref.ACT_EPS) / ref.FP8_MAX)
    assert (ref.dequant_fp8_act(qg, sg, 128) - x).abs().max() <= x.abs().max() * 2**-4
    qs, ss = ref.quant_fp8_act(x, static_scale=torch.tensor([0.001]))
    assert ss.shape == () and qs.float().abs().max() == ref.FP8_MAX  # clamped, not overflowed
    with pytest.raises(ValueError, match="static"):
        ref.quant_fp8_act(x, group=128, static_scale=torch.tensor(1.0))


def test_w8a8_reference_is_the_weight_reference_within_activation_rounding():
    g = torch.Generator().manual_seed(0)
    w, s = ref.quant_fp8(torch.randn(64, 256, generator=g) * 0.05, block=(128, 128))
    x = torch.randn(7, 256, generator=g).to(torch.bfloat16)
    got = ref.fp8_linear_w8a8(x, w, s, (128, 128))
    assert got.dtype == torch.bfloat16
    want = ref.fp8_linear(x.float(), w, s, (128, 128))
    assert (got.float() - want).abs().max() <= 0.05 * want.abs().max()
    assert not torch.equal(got.float(), want.to(torch.bfloat16).float())  # the activations were quantized


def test_row_buckets_and_splits():
    assert tiles.warmup_rows() == (1, 2, 3, 5, 9, 17, 65, 257)
    assert [tiles.bucket_of(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 65, 256, 257, 8192)] == [
        0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    with pytest.raises(ValueError):
        tiles.bucket_of(0)
    # Llama-8B o_proj at one row, BLOCK_N 64: 64 tiles on 132 SMs, 32 K tiles -> 4 splits of 8 tiles
    assert tiles.split_k(64, 32, 132, True) == tiles.Split(4, 8)
    assert tiles.split_k(448, 32, 132, True) == tiles.Split(1, 32)  # gate_up: enough tiles
    assert tiles.split_k(64, 32, 132, False) == tiles.Split(1, 32)
    assert tiles.split_k(1, 6, 132, True) == tiles.Split(1, 6)  # too short to split
    s = tiles.split_k(3, 100, 132, True)
    assert s.splits * s.k_tiles_per_split >= 100 and (s.splits - 1) * s.k_tiles_per_split < 100


def test_warm_up_linear_runs_one_call_per_bucket():
    seen = []
    assert quant.warm_up_linear(lambda x: seen.append(tuple(x.shape)), 32, torch.float32, "cpu") == 8
    assert seen == [(1, 32), (2, 32), (3, 32), (5, 32), (9, 32), (17, 32), (65, 32), (257, 32)]
    seen.clear()
    assert quant.warm_up_linear(lambda x: seen.append(x.shape[0]), 8, torch.float32, "cpu", max_rows=64) == 6
    assert seen == [1, 2, 3, 5, 9, 17]


def test_cpu_dispatch_imports_no_triton():
    import subprocess
    import sys

    code = ("import sys, torch; from radixlm.runtime.kernels import quant; "
            "w, s = quant.quant_fp8(torch.randn(8, 16)); quant.fp8_linear(torch.randn(2, 16), w, s); "
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_cuda_paths_refuse_bad_layouts_before_any_launch():
    pytest.importorskip("triton")
    from radixlm.runtime.kernels.quant import fp8_gemm, int4_gemm

    qw, s, z = ref.quant_int4(torch.randn(16, 64), 32)
    int4_gemm.check_int4(64, 16, qw, s, z, 32, None)
    with pytest.raises(ValueError, match=r"\(8, N\) int32 qweight"):
        int4_gemm.check_int4(64, 16, qw[:4], s, z, 32, None)
    with pytest.raises(ValueError, match="scales and zeros must be"):
        int4_gemm.check_int4(64, 16, qw, s, z, 16, None)
    with pytest.raises(ValueError, match="permutation"):
        int4_gemm.check_int4(64, 16, qw, s, z, 32, torch.arange(32))
    assert [int4_gemm.int4_block_k(4096, g) for g in (32, 64, 128, 4096, 48, 8)] == [32, 64, 128, 128, 16, None]
    w, ws = ref.quant_fp8(torch.randn(16, 64))
    with pytest.raises(ValueError, match="FP8 GEMM takes"):
        fp8_gemm.fp8_linear_cuda(torch.randn(2, 32), w, ws)
    with pytest.raises(ValueError, match="static input scale"):
        fp8_gemm.fp8_linear_cuda(torch.randn(2, 64), w, ws, (128, 128), None, torch.tensor(1.0))
    assert fp8_gemm.block_shape_ok((128, 128)) and not fp8_gemm.block_shape_ok((128, 96))


def test_startup_warms_each_quantized_linear_at_every_bucket():
    from types import SimpleNamespace

    from torch import nn

    from radixlm.runtime.kernels.startup.warmup import warm_up_quantized
    from radixlm.runtime.layers.linear import Linear

    calls = []

    class Method:
        def apply(self, layer, x, bias):
            calls.append((layer.in_features, tuple(x.shape), x.dtype, bias is layer.bias))
            return x

    quantized, plain = Linear(32, 16, bias=True), Linear(8, 8)
    quantized.quant_method = Method()
    runner = SimpleNamespace(model=nn.Sequential(quantized, plain), device="cpu",
                             model_config=SimpleNamespace(dtype=torch.bfloat16))
    warm_up_quantized(runner)
    assert calls == [(32, (m, 32), torch.bfloat16, True) for m in tiles.warmup_rows()]
