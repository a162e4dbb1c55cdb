"""The float8 KV pool (--kv-cache-dtype fp8_e4m3 / fp8_e5m2): quantize / dequantize round trips within the format's
error, saturation, the pool's store and its size."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.cache.kv_quant import KVScales, dequantize_kv, kv_cache_torch_dtype, quantize_kv
from radixlm.runtime.cache.memory_pool import TokenToKVPool

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# Relative rounding error of the formats' normal numbers: half a unit in the last of 3 (e4m3) or 2 (e5m2) bits.
REL_ERR = {torch.float8_e4m3fn: 2.0**-4, torch.float8_e5m2: 2.0**-3}


def test_kv_cache_dtype_names():
    assert kv_cache_torch_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert kv_cache_torch_dtype("fp8_e4m3", torch.bfloat16) is torch.float8_e4m3fn
    assert kv_cache_torch_dtype("fp8_e5m2", torch.float32) is torch.float8_e5m2
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp8'"):
        kv_cache_torch_dtype("fp8", torch.float32)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("scale", [1.0, 0.03, 8.0])
def test_round_trip_within_the_formats_error_and_saturates(dtype, scale):
    torch.manual_seed(0)
    x = torch.randn(4096) * 3 * scale
    stored = quantize_kv(x, scale, dtype)
    assert stored.dtype == dtype
    back = dequantize_kv(stored, scale, torch.float32)
    normal = x.abs() > torch.finfo(dtype).smallest_normal * scale
    assert ((back - x).abs()[normal] <= REL_ERR[dtype] * x.abs()[normal] + 1e-12).all()
    assert (back - x).abs().max() <= REL_ERR[dtype] * x.abs().max()
    biggest = torch.finfo(dtype).max
    huge = quantize_kv(torch.tensor([1e9, -1e9, float(biggest) * scale * 1.01]), scale, dtype).float()
    assert huge.tolist() == [biggest, -biggest, biggest]  # saturated, never inf or NaN


def test_auto_pool_stores_as_before_and_ignores_scales():
    pool = TokenToKVPool(8, 1, torch.float16, 1, 2, 4, "cpu", [KVScales(0.5, 2.0)])
    assert pool.kv_scales(0) == KVScales() and not pool.is_fp8
    k, v = torch.randn(2, 8), torch.randn(2, 8)
    pool.set_kv_buffer(0, torch.tensor([3, 5]), k, v)
    assert torch.equal(pool.k_buffer[0][[3, 5]], k.view(2, 2, 4).half())


@pytest.mark.parametrize("dtype", FP8)
def test_fp8_pool_stores_per_layer_scaled_values_in_half_the_bytes(dtype):
    scales = [KVScales(), KVScales(0.5, 4.0)]
    pool = TokenToKVPool(16, 4, dtype, 2, 2, 8, "cpu", scales)
    half = TokenToKVPool(16, 4, torch.bfloat16, 2, 2, 8, "cpu")
    assert pool.is_fp8 and pool.k_buffer[1].dtype == dtype and pool.kv_scales(1) == scales[1]
    assert 2 * pool.mem_bytes() == half.mem_bytes()
    k, v = torch.randn(3, 16), torch.randn(3, 2, 8)
    loc = torch.tensor([4, 9, 17])
    pool.set_kv_buffer(1, loc, k, v)
    assert torch.equal(pool.k_buffer[1][loc].view(torch.uint8),
                       quantize_kv(k.view(3, 2, 8), 0.5, dtype).view(torch.uint8))
    got_v = dequantize_kv(pool.v_buffer[1][loc], 4.0, torch.float32)
    assert ((got_v - v).abs() <= REL_ERR[dtype] * v.abs() + 1e-2).all()
    assert not pool.k_buffer[0].float().any()
    with pytest.raises(ValueError, match="1 KV scales for 2 layers"):
        TokenToKVPool(16, 4, dtype, 2, 2, 8, "cpu", scales[:1])


@pytest.mark.parametrize("dtype", FP8 + [torch.float32])
def test_tree_kv_moves_copy_a_float8_pool_bit_for_bit(dtype):
    pool = TokenToKVPool(8, 1, dtype, 2, 2, 4, "cpu", [KVScales(0.5, 2.0)] * 2)
    for layer in range(2):
        pool.set_kv_buffer(layer, torch.arange(1, 9), torch.randn(8, 8), torch.randn(8, 8))
    before = [b.clone() for b in pool.k_buffer + pool.v_buffer]
    pool.move_slots(torch.tensor([5, 6]), torch.tensor([2, 5]))  # 5 is read before it is overwritten
    for got, was in zip(pool.k_buffer + pool.v_buffer, before):
        want = was.clone()
        want.view(torch.uint8 if dtype != torch.float32 else dtype)[[2, 5]] = \
            was.view(torch.uint8 if dtype != torch.float32 else dtype)[[5, 6]]
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_e4m3_query_rows_round_each_row_to_e4m3_at_its_own_scale():
    from radixlm.runtime.cache.kv_quant import e4m3_query_rows

    q = torch.randn(3, 4, 16, dtype=torch.bfloat16)
    got = e4m3_query_rows(q)
    rows = q.float()
    scale = rows.abs().amax(-1, keepdim=True) / 448.0
    on_grid = got / scale
    # every value an e4m3 value at its row's scale (up to float32's rounding of the scale's product and quotient)
    assert torch.allclose(on_grid, on_grid.to(torch.float8_e4m3fn).float(), rtol=1e-5, atol=0)
    assert torch.allclose(got.abs().amax(-1), rows.abs().amax(-1))  # each row's largest kept (448 is e4m3's)
    assert 0 < (got - rows).abs().max() <= 2 ** -4 * rows.abs().max()  # rounded, within half of e4m3's step
    assert torch.equal(e4m3_query_rows(torch.zeros(2, 8)), torch.zeros(2, 8))  # an all-zero row stays zero
