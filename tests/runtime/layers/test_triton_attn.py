"""Triton split-K decode attention vs a dense float32 reference, on fresh random paged pools (CUDA only)."""
from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels need CUDA")


def _case(bs, heads, kv_heads, head_dim, max_len, page_size, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    seq_lens = torch.randint(1, max_len + 1, (bs,), generator=g, device=dev)
    num_slots = (int((seq_lens + page_size - 1).div(page_size, rounding_mode="floor").sum()) + 4) * page_size
    k_buf = torch.randn(num_slots, kv_heads, head_dim, generator=g, device=dev).to(dtype)
    v_buf = torch.randn(num_slots, kv_heads, head_dim, generator=g, device=dev).to(dtype)
    rows = bs + 3
    req_to_token = torch.zeros(rows, max_len + 8, dtype=torch.int64, device=dev)
    # Pages in shuffled order, so a request's slots are neither contiguous nor ordered.
    pages = torch.randperm(num_slots // page_size - 1, generator=g, device=dev) + 1
    next_page = 0
    pool_rows = torch.randperm(rows, generator=g, device=dev)[:bs]
    for i in range(bs):
        n = int(seq_lens[i])
        need = -(-n // page_size)
        own = pages[next_page : next_page + need]
        next_page += need
        slots = (own[:, None] * page_size + torch.arange(page_size, device=dev)[None, :]).reshape(-1)[:n]
        req_to_token[pool_rows[i], :n] = slots
    q = torch.randn(bs, heads, head_dim, generator=g, device=dev).to(dtype)
    return q, k_buf, v_buf, req_to_token, pool_rows, seq_lens


def _reference(q, k_buf, v_buf, req_to_token, pool_rows, seq_lens, scale):
    out = []
    group = q.shape[1] // k_buf.shape[1]
    for i in range(q.shape[0]):
        slots = req_to_token[pool_rows[i], : int(seq_lens[i])]
        k = k_buf[slots].float().repeat_interleave(group, dim=1)  # (n, H, D)
        v = v_buf[slots].float().repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].float(), k) * scale
        out.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 64), (9, 3, 64), (32, 8, 128), (14, 2, 64)])
@pytest.mark.parametrize("bs,max_len", [(1, 1), (1, 3000), (7, 300), (64, 700)])
def test_decode_matches_reference(bs, max_len, heads, kv_heads, head_dim, page_size, dtype):
    from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention

    q, k_buf, v_buf, rt, rows, lens = _case(bs, heads, kv_heads, head_dim, max_len, page_size, dtype,
                                            seed=bs * 31 + max_len + heads)
    scale = 1 / math.sqrt(head_dim)
    got = decode_attention(q, k_buf, v_buf, rt, rows, lens, scale, int(lens.max()))
    want = _reference(q, k_buf, v_buf, rt, rows, lens, scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("num_splits", [1, 3, 16])
def test_split_counts_agree(num_splits):
    from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention

    q, k_buf, v_buf, rt, rows, lens = _case(5, 8, 2, 64, 500, 4, torch.float32, seed=7)
    want = _reference(q, k_buf, v_buf, rt, rows, lens, 0.125)
    got = decode_attention(q, k_buf, v_buf, rt, rows, lens, 0.125, int(lens.max()), num_splits=num_splits)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
