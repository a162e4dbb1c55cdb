"""The INT4 checkpoint layouts (AWQ GEMM, GPTQ v1/v2 with and without act-order, compressed-tensors pack-quantized)
read into radixlm's INT4 layout: each packer's output, read back, dequantizes to the codes' weight; the formats' own
libraries agree with the packers where they are installed (compressed-tensors; AutoAWQ's and GPTQModel's pure-torch
functions when present, else skipped)."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kernels.quant import int4_linear
from radixlm.runtime.quantization.int4 import default_g_idx, quantize_codes, to_int4, unpack_cols, pack_cols
from radixlm.runtime.quantization.int4_formats import (
    AWQ_ORDER, awq_to_int4, compressed_to_int4, gptq_to_int4, pack_awq, pack_compressed, pack_gptq)

N, K = 48, 256


def _weight(seed: int, n: int = N, k: int = K) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.1


def _act_order(seed: int, k: int = K) -> torch.Tensor:
    return torch.randperm(k, generator=torch.Generator().manual_seed(seed))


def _check(int4, codes, x_seed: int = 0) -> None:
    ref = codes.dequantize()
    assert torch.equal(int4.dequantize(), ref)
    x = torch.randn(3, ref.shape[1], generator=torch.Generator().manual_seed(x_seed))
    got = int4_linear(x, int4.qweight, int4.scales, int4.zeros, int4.group_size, int4.perm)
    torch.testing.assert_close(got, x @ ref.t(), rtol=1e-5, atol=1e-5)


def test_pack_cols_orders_round_trip():
    codes = torch.randint(0, 16, (5, 32))
    for order in (tuple(range(8)), AWQ_ORDER):
        assert torch.equal(unpack_cols(pack_cols(codes, order), order), codes.to(torch.uint8))
    # AWQ's word holds columns 0, 2, 4, 6, 1, 3, 5, 7 from its low nibble up
    one = torch.arange(8).reshape(1, 8)
    word = int(pack_cols(one, AWQ_ORDER)[0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == list(AWQ_ORDER)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_awq_round_trip(group_size):
    g = K if group_size == -1 else group_size
    codes = quantize_codes(_weight(1), g, symmetric=False)
    t = pack_awq(codes.codes, codes.scales, codes.zeros)
    assert t["qweight"].shape == (K, N // 8) and t["qzeros"].shape == (K // g, N // 8)
    int4 = awq_to_int4(t["qweight"], t["qzeros"], t["scales"], default_g_idx(K, g), torch.float32, "l")
    assert int4.perm is None and int4.group_size == g
    _check(int4, codes)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("v1", [False, True])
def test_gptq_round_trip(act_order, sym, v1):
    perm = _act_order(2) if act_order else None
    codes = quantize_codes(_weight(2), 64, symmetric=sym, act_order=perm)
    t = pack_gptq(codes.codes, codes.scales, codes.zeros, codes.g_idx, v1)
    if sym:  # GPTQ's symmetric zero 8, stored as 7 by v1
        assert (t["qzeros"] == (0x77777777 if v1 else -0x77777778)).all()
    int4 = gptq_to_int4(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], v1, torch.float32, "l")
    assert (int4.perm is not None) == act_order and int4.group_size == 64
    _check(int4, codes)


def test_gptq_packer_matches_gptqmodel_dequantize():
    """GPTQModel's dequantize_weight (nn_modules/qlinear), restated: qzeros' nibbles from the low bits up are columns
    8c .. 8c + 7, qweight's are input rows 8r .. 8r + 7; w = scales[g_idx] * (q - zeros[g_idx]); a v1 checkpoint's
    zero word is converted by adding 0x11111111 (convert_gptq_v1_to_v2_format_module)."""
    shifts = torch.arange(0, 32, 4)
    codes = quantize_codes(_weight(10), 32, symmetric=False, act_order=_act_order(10))
    for v1 in (False, True):
        t = pack_gptq(codes.codes, codes.scales, codes.zeros, codes.g_idx, v1)
        qzeros = t["qzeros"].to(torch.int64) + (0x11111111 if v1 else 0)
        zeros = ((qzeros[:, :, None] >> shifts) & 0xF).reshape(qzeros.shape[0], -1)
        q = ((t["qweight"].to(torch.int64)[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(K, N)
        g = t["g_idx"].long()
        w = t["scales"].float()[g] * (q - zeros[g])
        assert torch.equal(w.t(), codes.dequantize())


def test_gptq_v1_zero_zero_borrows_and_comes_back():
    codes = quantize_codes(_weight(3), 32, symmetric=False)
    zeros = codes.zeros.clone()
    zeros[:, ::3] = 0  # stored as -1: the word's subtraction borrows from the next code
    codes = type(codes)(codes.codes, codes.scales, zeros, codes.g_idx)
    t = pack_gptq(codes.codes, codes.scales, codes.zeros, None, v1=True)
    _check(gptq_to_int4(t["qweight"], t["qzeros"], t["scales"], default_g_idx(K, 32), True, torch.float32, "l"), codes)


@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_compressed_round_trip(sym, act_order):
    perm = _act_order(4) if act_order else None
    codes = quantize_codes(_weight(4), 32, symmetric=sym, act_order=perm)
    t = pack_compressed(codes.codes, codes.scales, None if sym else codes.zeros, codes.g_idx if act_order else None)
    g_idx = t.get("weight_g_idx", default_g_idx(K, 32))
    int4 = compressed_to_int4(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), g_idx,
                              torch.float32, "l")
    _check(int4, codes)


def test_row_slices_of_act_order_groups_are_exact():
    """A row-parallel rank's channels of an act-order weight: whole groups are not theirs, the groups get finer."""
    codes = quantize_codes(_weight(5), 64, symmetric=False, act_order=_act_order(5))
    ref = codes.dequantize()
    for lo, hi in ((0, 128), (128, 256)):
        int4 = to_int4(codes.codes[lo:hi], codes.scales, codes.zeros, codes.g_idx[lo:hi], torch.float32, "l")
        assert int4.group_size < 64
        assert torch.equal(int4.dequantize(), ref[:, lo:hi])


def test_compressed_tensors_library_agrees():
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    del ct
    codes = quantize_codes(_weight(6), 32, symmetric=False)
    t = pack_compressed(codes.codes, codes.scales, codes.zeros, None)
    signed = (codes.codes.t().to(torch.int16) - 8).to(torch.int8)
    zp_signed = (codes.zeros.t() - 8).round().to(torch.int8)
    assert torch.equal(t["weight_packed"], pack_to_int32(signed, 4))
    assert torch.equal(t["weight_zero_point"], pack_to_int32(zp_signed, 4, packed_dim=0))
    assert torch.equal(unpack_from_int32(t["weight_packed"], 4, torch.Size([N, K])), signed)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32)
    w = dequantize(unpack_from_int32(t["weight_packed"], 4, torch.Size([N, K])), t["weight_scale"].float(),
                   unpack_from_int32(t["weight_zero_point"], 4, torch.Size([N, K // 32]), packed_dim=0), args)
    torch.testing.assert_close(w.float(), codes.dequantize(), rtol=0, atol=1e-6)


def _awq_dequantize_as_autoawq(qweight, qzeros, scales, group_size):
    """AutoAWQ's dequantize_gemm (awq/utils/packing_utils.py), restated: unpack each int32 into its eight nibbles
    from the low bits up, then undo AWQ's interleave with the reverse order [0, 4, 1, 5, 2, 6, 3, 7] per 8 columns."""
    reverse = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
    shifts = torch.arange(0, 32, 4)

    def unpack(t):
        nibbles = (t[:, :, None].to(torch.int64) >> shifts) & 0xF  # (R, C, 8)
        flat = nibbles.reshape(t.shape[0], -1)
        order = (torch.arange(flat.shape[1]).view(-1, 8)[:, reverse]).reshape(-1)
        return flat[:, order]

    w, z = unpack(qweight), unpack(qzeros)
    return (w - z.repeat_interleave(group_size, 0)) * scales.float().repeat_interleave(group_size, 0)


def test_awq_packer_matches_autoawq_layout():
    codes = quantize_codes(_weight(9), 32, symmetric=False)
    t = pack_awq(codes.codes, codes.scales, codes.zeros)
    assert torch.equal(_awq_dequantize_as_autoawq(t["qweight"], t["qzeros"], t["scales"], 32).t(), codes.dequantize())
    word = int(pack_awq(torch.arange(8).reshape(1, 8), torch.ones(1, 8), torch.zeros(1, 8))["qweight"][0, 0])
    assert word == 0x75316420  # AWQ's interleave: columns 0, 2, 4, 6, 1, 3, 5, 7 from the low nibble up


def test_autoawq_unpacker_agrees():
    packing = pytest.importorskip("awq.utils.packing_utils", reason="AutoAWQ is not installed")
    codes = quantize_codes(_weight(7), 64, symmetric=False)
    t = pack_awq(codes.codes, codes.scales, codes.zeros)
    w = packing.dequantize_gemm(t["qweight"], t["qzeros"], t["scales"].float(), 4, 64)
    assert torch.equal(w.t().float(), codes.dequantize())


@pytest.mark.parametrize("sym, group", [(True, 32), (False, 32), (True, -1), (False, -1)])
def test_compressed_tensors_decompressor_reads_the_packer(sym, group):
    """compressed-tensors' own PackedQuantizationCompressor decompresses pack_compressed's tensors to the codes'
    weight, and our reader agrees."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    g = K if group == -1 else group
    codes = quantize_codes(_weight(8), g, symmetric=sym)
    t = pack_compressed(codes.codes, codes.scales, None if sym else codes.zeros, None)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=sym, strategy="channel" if group == -1 else "group",
                            group_size=None if group == -1 else group)
    state = {**t, "weight_scale": t["weight_scale"].float()}  # the product in float32, as ours
    out = PackedQuantizationCompressor.decompress(state, QuantizationScheme(targets=["Linear"], weights=args))
    ref = codes.dequantize()
    torch.testing.assert_close(out["weight"].float(), ref, rtol=0, atol=1e-6)
    int4 = compressed_to_int4(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), default_g_idx(K, g),
                              torch.float32, "l")
    assert torch.equal(int4.dequantize(), ref)


def test_autoawq_packer_agrees():
    """AutoAWQ's own WQLinear_GEMM.from_linear packs the codes' weight into pack_awq's tensors (skipped without
    AutoAWQ; checked by hand against AutoAWQ 0.2.9's source)."""
    gemm = pytest.importorskip("awq.modules.linear.gemm", reason="AutoAWQ is not installed")
    codes = quantize_codes(_weight(11, n=64), 64, symmetric=False)  # AutoAWQ packs whole words of 32 columns
    linear = torch.nn.Linear(K, 64, bias=False)
    linear.weight.data = codes.dequantize()
    awq = gemm.WQLinear_GEMM.from_linear(linear, 4, 64, scales=codes.scales.float(), zeros=codes.zeros)
    mine = pack_awq(codes.codes, codes.scales, codes.zeros)
    assert torch.equal(awq.qweight, mine["qweight"]) and torch.equal(awq.qzeros, mine["qzeros"])


def test_autogptq_packer_agrees():
    """AutoGPTQ's own QuantLinear.pack writes pack_gptq's v1 tensors (skipped without AutoGPTQ; checked by hand
    against AutoGPTQ 0.7.1's source). Zero points from 1: AutoGPTQ's v1 packer overflows on a zero point of 0."""
    qlinear = pytest.importorskip("auto_gptq.nn_modules.qlinear.qlinear_cuda_old", reason="AutoGPTQ is not installed")
    from radixlm.runtime.quantization.int4 import Codes

    codes = quantize_codes(_weight(12, n=64), 32, symmetric=False)  # AutoGPTQ packs whole words of 32 columns
    codes = Codes(codes.codes, codes.scales.float(), codes.zeros.clamp(min=1), codes.g_idx)
    linear = torch.nn.Linear(K, 64, bias=False)
    linear.weight.data = codes.dequantize()
    ql = qlinear.QuantLinear(4, 32, K, 64, False)
    ql.pack(linear, codes.scales.t().contiguous(), codes.zeros.t().contiguous(), codes.g_idx.int())
    mine = pack_gptq(codes.codes, codes.scales, codes.zeros, codes.g_idx, v1=True)
    assert torch.equal(ql.qweight, mine["qweight"]) and torch.equal(ql.qzeros, mine["qzeros"])
