"""TorchNativeAttnBackend over the paged pool vs a dense float64 reference."""
import math

import pytest
import torch

from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool, TokenToKVPoolAllocator
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.layers.attention.torch_native import TorchNativeAttnBackend
from radixlm.runtime.layers.radix_attention import RadixAttention

torch.set_num_threads(1)
HEAD_DIM = 8
LAYER_ID = 1


def dense_reference(q, k_full, v_full, prefix: int, scale: float) -> torch.Tensor:
    """q: (ext, H, D); k_full, v_full: (seq, Hkv, D). Returns (ext, H, D) in float64."""
    q, k_full, v_full = q.double(), k_full.double(), v_full.double()
    rep = q.shape[1] // k_full.shape[1]
    k = k_full.repeat_interleave(rep, dim=1)
    v = v_full.repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    ext, seq = q.shape[0], k.shape[0]
    allowed = torch.arange(seq)[None, :] <= (prefix + torch.arange(ext))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


def build_batch(lens, num_heads, num_kv_heads, page_size, mode, dtype, seed, shared_prefix=False, batched_extend_max=64):
    """lens: [(prefix_len, extend_len)]. Returns (forward_batch, layer, q, k, v, per-request full K/V)."""
    g = torch.Generator().manual_seed(seed)
    bs = len(lens)
    req_pool = ReqToTokenPool(bs + 3, 64, "cpu")
    kv_pool = TokenToKVPool(512, page_size, dtype, 2, num_kv_heads, HEAD_DIM, "cpu")
    alloc = TokenToKVPoolAllocator(512, page_size, "cpu")
    # Fragment the pool so a request's pages are not contiguous.
    junk = alloc.alloc(16 * page_size)
    alloc.free(junk[::2 * page_size])
    req_pool.alloc()  # row 0 unused: request rows are not 0..bs-1
    rows, fulls = [], []
    for i, (prefix, ext) in enumerate(lens):
        row = req_pool.alloc()
        seq = prefix + ext
        kf = torch.randn(seq, num_kv_heads, HEAD_DIM, generator=g).to(dtype)
        vf = torch.randn(seq, num_kv_heads, HEAD_DIM, generator=g).to(dtype)
        if shared_prefix and i > 0 and prefix and prefix <= lens[0][0] and prefix % page_size == 0:
            # The prefix is request 0's cached prefix (same slots), as after a radix match.
            slots = req_pool.req_to_token[rows[0], :prefix].clone()
            kf[:prefix], vf[:prefix] = fulls[0][0][:prefix], fulls[0][1][:prefix]
        else:
            slots = alloc.alloc_extend([0], [prefix], [-1])
        kv_pool.set_kv_buffer(LAYER_ID, slots, kf[:prefix], vf[:prefix])
        req_pool.req_to_token[row, :prefix] = slots
        rows.append(row)
        fulls.append((kf, vf))
    prefix_lens = [p for p, _ in lens]
    seq_lens = [p + e for p, e in lens]
    last_locs = [int(req_pool.req_to_token[r, p - 1]) if p else -1 for r, p in zip(rows, prefix_lens)]
    out_cache_loc = alloc.alloc_extend(prefix_lens, seq_lens, last_locs)
    assert out_cache_loc is not None
    starts, acc = [], 0
    for (p, e), r in zip(lens, rows):
        req_pool.req_to_token[r, p : p + e] = out_cache_loc[acc : acc + e]
        starts.append(acc)
        acc += e
    layer = RadixAttention(num_heads, HEAD_DIM, 1.0 / math.sqrt(HEAD_DIM), num_kv_heads, LAYER_ID)
    q = torch.randn(acc, num_heads * HEAD_DIM, generator=g).to(dtype)
    k = torch.cat([kf[p:] for (kf, _), (p, _) in zip(fulls, lens)]).reshape(acc, -1)
    v = torch.cat([vf[p:] for (_, vf), (p, _) in zip(fulls, lens)]).reshape(acc, -1)
    positions = torch.cat([torch.arange(p, p + e) for p, e in lens])
    fb = ForwardBatch(
        forward_mode=mode,
        batch_size=bs,
        input_ids=torch.zeros(acc, dtype=torch.int64),
        positions=positions,
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        seq_lens_cpu=seq_lens,
        out_cache_loc=out_cache_loc,
        req_to_token_pool=req_pool,
        token_to_kv_pool=kv_pool,
        attn_backend=TorchNativeAttnBackend(batched_extend_max=batched_extend_max),
        extend_prefix_lens_cpu=prefix_lens,
        extend_seq_lens_cpu=[e for _, e in lens],
        extend_start_loc=torch.tensor(starts, dtype=torch.int64),
    )
    return fb, layer, q, k, v, fulls


def check_against_reference(lens, heads, kv_heads, ps, mode, dtype=torch.float32, atol=1e-5, seed=0,
                            shared_prefix=False, batched_extend_max=64):
    fb, layer, q, k, v, fulls = build_batch(lens, heads, kv_heads, ps, mode, dtype, seed, shared_prefix, batched_extend_max)
    fb.attn_backend.init_forward_metadata(fb)
    out = layer(q, k, v, fb)
    assert out.shape == q.shape and out.dtype == dtype
    kv_pool = fb.token_to_kv_pool
    assert torch.equal(kv_pool.get_key_buffer(LAYER_ID)[fb.out_cache_loc].reshape(k.shape), k)
    assert torch.equal(kv_pool.get_value_buffer(LAYER_ID)[fb.out_cache_loc].reshape(v.shape), v)
    qh = q.reshape(-1, heads, HEAD_DIM)
    oh = out.reshape(-1, heads, HEAD_DIM)
    start = 0
    for (prefix, ext), (kf, vf) in zip(lens, fulls):
        ref = dense_reference(qh[start : start + ext], kf, vf, prefix, layer.scaling)
        torch.testing.assert_close(oh[start : start + ext].double(), ref, atol=atol, rtol=atol)
        start += ext


HEADS = [(4, 4), (4, 2), (6, 1)]


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize(
    "lens",
    [
        [(0, 1)],
        [(0, 7)],
        [(5, 1)],
        [(0, 9), (3, 1), (8, 5), (13, 6)],
        [(4, 4), (0, 1), (6, 11)],
    ],
)
@pytest.mark.parametrize("batched_extend_max", [0, 64], ids=["per-request", "padded"])
def test_extend_matches_dense(lens, heads, kv_heads, ps, batched_extend_max):
    check_against_reference(lens, heads, kv_heads, ps, ForwardMode.REQUEST_SPANS, seed=len(lens) * 7 + ps,
                            batched_extend_max=batched_extend_max)


@pytest.mark.parametrize("ps", [1, 4])
def test_mixed_decode_pass_with_jump_tokens(ps):
    """A decode pass carrying jump-forward tokens: most requests add one token, some several."""
    lens = [(7, 1), (12, 5), (3, 1), (20, 9), (9, 1)]
    check_against_reference(lens, 4, 2, ps, ForwardMode.REQUEST_SPANS, seed=5 + ps)


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize("seq_lens", [[1], [9], [1, 17, 4, 8, 3], [12, 12]])
def test_decode_matches_dense(seq_lens, heads, kv_heads, ps):
    lens = [(s - 1, 1) for s in seq_lens]
    check_against_reference(lens, heads, kv_heads, ps, ForwardMode.TOKEN_ROWS, seed=sum(seq_lens) + ps)


@pytest.mark.parametrize("ps", [1, 4])
def test_extend_with_shared_prefix_slots(ps):
    lens = [(8, 3), (8, 5), (4, 1)]
    check_against_reference(lens, 4, 2, ps, ForwardMode.REQUEST_SPANS, seed=3, shared_prefix=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", [ForwardMode.REQUEST_SPANS, ForwardMode.TOKEN_ROWS])
def test_half_precision(dtype, mode):
    lens = [(6, 5), (0, 7)] if mode == ForwardMode.REQUEST_SPANS else [(6, 1), (0, 1), (10, 1)]
    check_against_reference(lens, 4, 2, 4, mode, dtype=dtype, atol=3e-2, seed=11)


def test_lazy_metadata_and_no_save():
    lens = [(3, 2), (0, 4)]
    fb, layer, q, k, v, fulls = build_batch(lens, 4, 2, 1, ForwardMode.REQUEST_SPANS, torch.float32, seed=5)
    first = layer(q, k, v, fb)  # no init_forward_metadata: the backend builds it on first use
    second = fb.attn_backend.forward(q, None, None, layer, fb, save_kv_cache=False)  # KV already in pool
    torch.testing.assert_close(first, second)


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("heads,kv_heads", HEADS)
def test_decode_reads_a_shared_prefix_once(ps, heads, kv_heads):
    """Requests sharing their first prefix slots (as after radix matches) take the shared-prefix path."""
    lens = [(24, 1), (24, 1), (24, 1)]
    fb, layer, q, k, v, fulls = build_batch(lens, heads, kv_heads, ps, ForwardMode.TOKEN_ROWS, torch.float32, 5, shared_prefix=True)
    fb.attn_backend = TorchNativeAttnBackend(shared_prefix_min=4)
    fb.attn_backend.init_forward_metadata(fb)
    assert fb.attn_metadata.shared_slots is not None and len(fb.attn_metadata.shared_slots) == 24
    out = layer(q, k, v, fb).reshape(-1, heads, HEAD_DIM)
    qh = q.reshape(-1, heads, HEAD_DIM)
    for i, ((prefix, _), (kf, vf)) in enumerate(zip(lens, fulls)):
        ref = dense_reference(qh[i : i + 1], kf, vf, prefix, layer.scaling)
        torch.testing.assert_close(out[i : i + 1].double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("mode, lens, shared, batched", [
    (ForwardMode.REQUEST_SPANS, [(0, 9), (3, 1), (8, 5)], False, 0),
    (ForwardMode.REQUEST_SPANS, [(4, 4), (0, 1), (6, 3)], False, 64),
    (ForwardMode.TOKEN_ROWS, [(12, 1), (0, 1), (5, 1)], False, 64),
    (ForwardMode.TOKEN_ROWS, [(24, 1), (24, 1), (24, 1)], True, 64),
], ids=["extend", "extend-padded", "decode", "decode-shared-prefix"])
def test_fp8_pool_stores_quantized_and_reads_stored_times_scales(kv_dtype, mode, lens, shared, batched):
    """--kv-cache-dtype fp8_*: the pool stores the new tokens' k / k_scale and v / v_scale in float8, and every path
    attends over stored * scale (the dense reference on those values)."""
    from radixlm.runtime.cache.kv_quant import KVScales, dequantize_kv, quantize_kv

    fb, layer, q, k, v, fulls = build_batch(lens, 4, 2, 1, mode, torch.float32, seed=21, shared_prefix=shared,
                                            batched_extend_max=batched)
    scales = KVScales(0.25, 2.0)
    pool = TokenToKVPool(512, 1, kv_dtype, 2, 2, HEAD_DIM, "cpu", [KVScales(), scales])
    for src, dst, s in ((fb.token_to_kv_pool.k_buffer, pool.k_buffer, scales.k_scale),
                        (fb.token_to_kv_pool.v_buffer, pool.v_buffer, scales.v_scale)):
        dst[LAYER_ID].copy_(quantize_kv(src[LAYER_ID], s, kv_dtype))
    fb.token_to_kv_pool = pool
    fb.attn_backend = TorchNativeAttnBackend(shared_prefix_min=4 if shared else 64, batched_extend_max=batched)
    fb.attn_backend.init_forward_metadata(fb)
    assert (fb.attn_metadata.shared_slots is not None) == shared
    out = layer(q, k, v, fb).reshape(-1, 4, HEAD_DIM)
    stored = pool.get_key_buffer(LAYER_ID)[fb.out_cache_loc]
    assert stored.dtype == kv_dtype and torch.equal(stored.float(), quantize_kv(k, 0.25, kv_dtype).float().reshape(
        stored.shape))
    qh, start = q.reshape(-1, 4, HEAD_DIM), 0
    for (prefix, ext), (kf, vf) in zip(lens, fulls):
        kq = dequantize_kv(quantize_kv(kf, scales.k_scale, kv_dtype), scales.k_scale, torch.float32)
        vq = dequantize_kv(quantize_kv(vf, scales.v_scale, kv_dtype), scales.v_scale, torch.float32)
        ref = dense_reference(qh[start : start + ext], kq, vq, prefix, layer.scaling)
        torch.testing.assert_close(out[start : start + ext].double(), ref, atol=1e-5, rtol=1e-5)
        # Float8 keeps the output near the float pool's (e4m3: 3 mantissa bits, e5m2: 2).
        plain = dense_reference(qh[start : start + ext], kf, vf, prefix, layer.scaling)
        assert (out[start : start + ext].double() - plain).abs().max() < 0.25
        start += ext
