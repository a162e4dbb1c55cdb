"""The MLA latent KV pool: one (slots, 1, kv_lora_rank + qk_rope_head_dim) buffer per layer, sized by that layout, under
the same allocator, release / resume and slot moves as the K/V pool."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.cache.kv_pool import KVLayout, KVLayoutKind, MLATokenToKVPool
from radixlm.runtime.cache.memory_pool import TokenToKVPool, make_kv_pool

RANK, ROPE, LAYERS = 32, 8, 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_kv_bytes_per_token_are_the_latent_row(dtype):
    layout = KVLayout.mla(LAYERS, dtype, RANK, ROPE)
    assert layout.bytes_per_token == LAYERS * (RANK + ROPE) * dtype.itemsize
    pool = make_kv_pool(layout, size=16, page_size=4)
    assert isinstance(pool, MLATokenToKVPool) and pool.layout == layout
    assert [tuple(b.shape) for b in pool.buffers()] == [(20, 1, RANK + ROPE)] * LAYERS
    assert pool.mem_bytes() == (16 + 4) * layout.bytes_per_token
    # DeepSeek-V3's shapes: 61 layers of 512 + 64 bfloat16 values, against an equally wide 128-head MHA cache.
    v3 = KVLayout.mla(61, torch.bfloat16, 512, 64)
    assert v3.bytes_per_token == 61 * 576 * 2
    assert KVLayout.mha(61, torch.bfloat16, 128, 192).bytes_per_token // v3.bytes_per_token > 40
    assert v3.describe() == {"layout": "mla", "dtype": "bfloat16", "num_layers": 61, "buffers_per_layer": 1,
                             "row_shape": [1, 576], "bytes_per_token": 61 * 576 * 2, "kv_lora_rank": 512,
                             "qk_rope_head_dim": 64}


def test_latent_rows_store_move_release_and_resume():
    pool = MLATokenToKVPool(8, 1, torch.float32, LAYERS, RANK, ROPE)
    c_kv, k_pe = torch.randn(3, RANK), torch.randn(3, 1, ROPE)
    loc = torch.tensor([2, 5, 7])
    pool.set_mla_kv_buffer(1, loc, c_kv, k_pe)
    buf = pool.get_latent_buffer(1)
    assert torch.equal(buf[loc, 0, :RANK], c_kv) and torch.equal(buf[loc, 0, RANK:], k_pe[:, 0])
    assert not pool.get_latent_buffer(0).any() and not buf[[0, 1, 3, 4, 6, 8]].any()
    pool.move_slots(torch.tensor([5, 7]), torch.tensor([7, 1]))  # 7 is read before it is overwritten
    assert torch.equal(buf[7, 0], torch.cat([c_kv[1], k_pe[1, 0]])) and torch.equal(buf[1, 0, :RANK], c_kv[2])
    pool.release()
    assert pool.released and pool.mem_bytes() == 0
    pool.resume()
    assert not pool.released and pool.mem_bytes() == 9 * LAYERS * (RANK + ROPE) * 4
    with pytest.raises(ValueError, match="latent rows of widths 8 \\+ 8"):
        pool.set_mla_kv_buffer(0, loc, torch.randn(3, 8), k_pe)


def test_float8_latent_pool_stores_saturated_bytes():
    pool = MLATokenToKVPool(4, 1, torch.float8_e5m2, 1, RANK, ROPE)
    c_kv = torch.randn(2, RANK)
    c_kv[0, 0] = 1e9  # beyond e5m2's largest finite value: saturated, not inf
    pool.set_mla_kv_buffer(0, torch.tensor([1, 2]), c_kv, torch.randn(2, ROPE))
    stored = pool.get_latent_buffer(0)[1:3].float()
    assert stored[0, 0, 0] == torch.finfo(torch.float8_e5m2).max and stored.isfinite().all()
    assert ((stored[:, 0, 1:RANK] - c_kv[:, 1:]).abs() <= 0.25 * c_kv[:, 1:].abs() + 1e-3).all()


def test_layouts_are_checked():
    with pytest.raises(ValueError, match="kv_lora_rank >= 1"):
        KVLayout.mla(2, torch.float32, 0, 64)
    with pytest.raises(ValueError, match="row is"):
        KVLayout(KVLayoutKind.MLA, 2, torch.float32, 2, 576, 512, 64)
    mha = make_kv_pool(KVLayout.mha(2, torch.float16, 2, 4), 8, 4)
    assert isinstance(mha, TokenToKVPool) and mha.layout.bytes_per_token == 2 * 2 * 2 * 4 * 2
    assert mha.mem_bytes() == 12 * mha.layout.bytes_per_token
