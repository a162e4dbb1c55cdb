"""Fused CUDA kernels (RMSNorm + residual, SiLU-and-mul, rotary) against the torch reference paths the same
modules take on CPU, on fresh random inputs (run on the GPU machine; skipped without CUDA)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, exact_bf16: bool = True) -> None:
    """The kernels round where the reference rounds: bf16 results are bit-identical; in float16 and float32 only the
    float32 arithmetic inside (exp, rsqrt, sum order) may move a few elements by one unit in the last place."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if dtype == torch.bfloat16 and exact_bf16:
        assert torch.equal(got, ref), float((got.float() - ref.float()).abs().max())
        return
    tol = {torch.float16: 1e-3, torch.float32: 2e-6}[dtype]
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
    if got.numel() and dtype == torch.float16:  # float32 results differ in their last bit more often than not
        assert (got != ref).float().mean() < 0.01


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, hidden", [(1, 576), (7, 4096), (300, 896), (0, 64)])
def test_rmsnorm_with_and_without_residual(dtype, tokens, hidden):
    from radixlm.runtime.kernels.elementwise.fused_kernels import rmsnorm
    from radixlm.runtime.layers.norm import RMSNorm

    torch.manual_seed(tokens + hidden)
    norm = RMSNorm(hidden, 1e-5).cuda().to(dtype)
    norm.weight.data.normal_(1.0, 0.1)
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype) * 3
    res = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    _close(rmsnorm(x, norm.weight, 1e-5), norm._norm(x), dtype)
    out, new_res = rmsnorm(x, norm.weight, 1e-5, res)
    ref_res = x + res
    assert torch.equal(new_res, ref_res)
    _close(out, norm._norm(ref_res), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, d", [(1, 1536), (33, 14336), (5, 100), (0, 64)])
def test_silu_and_mul(dtype, tokens, d):
    import torch.nn.functional as F

    from radixlm.runtime.kernels.elementwise.fused_kernels import silu_and_mul

    x = torch.randn(tokens, 2 * d, device="cuda", dtype=dtype) * 4
    _close(silu_and_mul(x), F.silu(x[:, :d]) * x[:, d:], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size, q_heads, k_heads, scaling", [
    (64, 9, 3, None), (128, 32, 8, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    (64, 14, 2, None),
])
def test_rotary_matches_reference(dtype, head_size, q_heads, k_heads, scaling):
    from radixlm.runtime.layers.rotary import get_rope

    rope = get_rope(head_size, 16384, 500000.0, scaling)
    tokens = 37
    pos = torch.randint(0, 16384, (tokens,), device="cuda")
    qkv = torch.randn(tokens, (q_heads + 2 * k_heads) * head_size, device="cuda", dtype=dtype)
    q, k, _ = qkv.split([q_heads * head_size, k_heads * head_size, k_heads * head_size], dim=-1)
    ref_q, ref_k = q.clone(), k.clone()
    # The reference path: the module's torch ops on the same (CUDA) tensors.
    rope.cos_sin_cache = rope.cos_sin_cache.cuda()
    cos_sin = rope.cos_sin_cache[pos].to(dtype)
    cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)
    want_q = rope._rotate(ref_q.view(tokens, q_heads, head_size), cos, sin).reshape(tokens, -1)
    want_k = rope._rotate(ref_k.view(tokens, k_heads, head_size), cos, sin).reshape(tokens, -1)
    got_q, got_k = rope(pos, q, k)
    _close(got_q, want_q, dtype)
    _close(got_k, want_k, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens, kv_heads, head_dim", [(1, 8, 128), (70, 3, 64), (0, 2, 64)])
def test_store_kv_from_strided_qkv_rows(dtype, tokens, kv_heads, head_dim):
    from radixlm.runtime.cache.memory_pool import TokenToKVPool

    pool = TokenToKVPool(256, 1, dtype, 1, kv_heads, head_dim, "cuda")
    width = kv_heads * head_dim
    qkv = torch.randn(tokens, 4 * width + 2 * width, device="cuda", dtype=dtype)
    _, k, v = qkv.split([4 * width, width, width], dim=-1)  # non-contiguous rows, as the model passes them
    loc = torch.randperm(255, device="cuda")[:tokens] + 1
    pool.set_kv_buffer(0, loc, k, v)
    assert torch.equal(pool.k_buffer[0][loc], k.reshape(-1, kv_heads, head_dim))
    assert torch.equal(pool.v_buffer[0][loc], v.reshape(-1, kv_heads, head_dim))
    untouched = torch.ones(257, dtype=torch.bool, device="cuda")
    untouched[loc] = False
    assert not pool.k_buffer[0][untouched].any() and not pool.v_buffer[0][untouched].any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens, q_heads, kv_heads, head_dim", [(1, 32, 8, 128), (70, 9, 3, 64), (0, 4, 2, 64)])
def test_rotated_kv_store_equals_rotation_then_store(dtype, tokens, q_heads, kv_heads, head_dim):
    """The pool's one-launch rotation and store: q and k rotated in place, and the pool's slots, bit-identical to the
    rotary module followed by set_kv_buffer."""
    from radixlm.runtime.cache.memory_pool import TokenToKVPool
    from radixlm.runtime.layers.rotary import get_rope

    rope = get_rope(head_dim, 4096, 500000.0)
    pools = [TokenToKVPool(256, 1, dtype, 2, kv_heads, head_dim, "cuda") for _ in range(2)]
    width = kv_heads * head_dim
    qkv = torch.randn(tokens, q_heads * head_dim + 2 * width, device="cuda", dtype=dtype)
    pos = torch.randint(0, 4096, (tokens,), device="cuda")
    loc = torch.randperm(255, device="cuda")[:tokens] + 1
    outs = []
    for fused, pool in zip((True, False), pools):
        q, k, v = qkv.clone().split([q_heads * head_dim, width, width], dim=-1)
        if fused:
            assert pool.set_rotated_kv_buffer(1, loc, q, k, v, rope, pos)
        else:
            q, k = rope(pos, q, k)
            pool.set_kv_buffer(1, loc, k, v)
        outs.append((q, k))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(pools[0].k_buffer[1], pools[1].k_buffer[1])
    assert torch.equal(pools[0].v_buffer[1], pools[1].v_buffer[1])
    assert not pools[0].k_buffer[0].any()


@pytest.mark.parametrize("rows, vocab", [(1, 128256), (3, 151936), (256, 32000), (2, 100)])
def test_argmax_rows_equals_torch_argmax(rows, vocab):
    from radixlm.runtime.kernels.elementwise.argmax import argmax_rows

    torch.manual_seed(rows)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, vocab, device="cuda").to(dtype)
        x[0, vocab // 3] = x[0, vocab - 1] = 100.0  # ties across blocks: the first index
        if rows > 1:
            x[1] = float("-inf")
        assert torch.equal(argmax_rows(x), torch.argmax(x, dim=-1))
        assert torch.equal(argmax_rows(x[:, : vocab - 7]), torch.argmax(x[:, : vocab - 7], dim=-1))
