"""Triton split-K decode attention vs a dense float32 reference, on fresh random paged pools (CUDA only)."""
from __future__ import annotations

import math
import random

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
    from radixlm.runtime.kernels.attention.decode import decode_attention

    q, k_buf, v_buf, rt, rows, lens = _case(bs, heads, kv_heads, head_dim, max_len, page_size, dtype,
                                            seed=bs * 31 + max_len + heads)
    scale = 1 / math.sqrt(head_dim)
    got = decode_attention(q, k_buf, v_buf, rt, rows, lens, scale, int(lens.max()))
    want = _reference(q, k_buf, v_buf, rt, rows, lens, scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("num_splits", [1, 3, 16, "chunked"])
def test_split_counts_agree(num_splits):
    from radixlm.runtime.kernels.attention.decode import decode_attention

    q, k_buf, v_buf, rt, rows, lens = _case(5, 8, 2, 64, 500, 4, torch.float32, seed=7)
    want = _reference(q, k_buf, v_buf, rt, rows, lens, 0.125)
    chunked = num_splits == "chunked"
    got = decode_attention(q, k_buf, v_buf, rt, rows, lens, 0.125, int(lens.max()),
                           num_splits=None if chunked else num_splits, chunked=chunked)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def _extend_case(lens, heads, kv_heads, head_dim, page_size, dtype, seed):
    """lens: [(prefix, extend)]; every key (prefix and new tokens) already in the pool, as after _save_kv."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    totals = torch.tensor([p + e for p, e in lens], device=dev)
    num_slots = (int((totals + page_size - 1).div(page_size, rounding_mode="floor").sum()) + 4) * page_size
    k_buf = torch.randn(num_slots, kv_heads, head_dim, generator=g, device=dev).to(dtype)
    v_buf = torch.randn(num_slots, kv_heads, head_dim, generator=g, device=dev).to(dtype)
    bs = len(lens)
    req_to_token = torch.zeros(bs + 2, int(totals.max()) + 8, dtype=torch.int64, device=dev)
    pages = torch.randperm(num_slots // page_size - 1, generator=g, device=dev) + 1
    rows = torch.randperm(bs + 2, generator=g, device=dev)[:bs]
    nxt = 0
    for i, n in enumerate(totals.tolist()):
        need = -(-n // page_size)
        own = pages[nxt : nxt + need]
        nxt += need
        req_to_token[rows[i], :n] = (own[:, None] * page_size + torch.arange(page_size, device=dev)).reshape(-1)[:n]
    total_new = sum(e for _, e in lens)
    q = torch.randn(total_new, heads, head_dim, generator=g, device=dev).to(dtype)
    return q, k_buf, v_buf, req_to_token, rows


def _extend_reference(q, k_buf, v_buf, req_to_token, rows, lens, scale):
    out, start = [], 0
    group = q.shape[1] // k_buf.shape[1]
    for i, (prefix, ext) in enumerate(lens):
        slots = req_to_token[rows[i], : prefix + ext]
        k = k_buf[slots].float().repeat_interleave(group, dim=1)
        v = v_buf[slots].float().repeat_interleave(group, dim=1)
        s = torch.einsum("thd,nhd->htn", q[start : start + ext].float(), k) * scale
        visible = torch.arange(prefix + ext, device=q.device)[None, :] <= (prefix + torch.arange(ext, device=q.device))[:, None]
        s = s.masked_fill(~visible, float("-inf"))
        out.append(torch.einsum("htn,nhd->thd", s.softmax(-1), v))
        start += ext
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 64), (9, 3, 64), (32, 8, 128)])
@pytest.mark.parametrize("lens", [
    [(0, 1)], [(0, 37)], [(100, 1)], [(0, 200), (5, 1), (64, 64), (130, 17)],
    [(1000, 3), (0, 1), (7, 300), (63, 65), (2, 2)],  # prefill chunks next to decode-like and jump-forward rows
])
def test_extend_matches_reference(lens, heads, kv_heads, head_dim, page_size, dtype):
    from radixlm.runtime.kernels.attention.extend import extend_attention

    q, k_buf, v_buf, rt, rows = _extend_case(lens, heads, kv_heads, head_dim, page_size, dtype, seed=len(lens) + heads)
    dev = "cuda"
    ext = torch.tensor([e for _, e in lens], device=dev)
    starts = torch.cumsum(ext, 0) - ext
    scale = 1 / math.sqrt(head_dim)
    got = extend_attention(q, k_buf, v_buf, rt, rows, torch.tensor([p for p, _ in lens], device=dev), ext, starts,
                           scale, int(ext.max()))
    want = _extend_reference(q, k_buf, v_buf, rt, rows, lens, scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_extend_work_list_order_changes_nothing():
    """Entries of the work list in any order (and one naming a block past its prompt) give the same output."""
    from radixlm.runtime.kernels.attention.extend import extend_attention
    from radixlm.runtime.kernels.attention.extend_blocks import extend_block_m, extend_blocks

    lens = [(0, 200), (5, 1), (64, 64), (130, 17), (0, 2048), (9, 40)]
    q, k_buf, v_buf, rt, rows = _extend_case(lens, 32, 8, 128, 1, torch.bfloat16, seed=3)
    dev = "cuda"
    ext = torch.tensor([e for _, e in lens], device=dev)
    prefix = torch.tensor([p for p, _ in lens], device=dev)
    starts = torch.cumsum(ext, 0) - ext
    bm = extend_block_m(int(ext.max()))
    pairs = list(zip(*[iter(extend_blocks(ext.tolist(), bm))] * 2))
    random.Random(0).shuffle(pairs)
    pairs.append((1, 5))  # request 1 has one new token: block 5 holds none and must write nothing
    blocks = torch.tensor([x for pair in pairs for x in pair], dtype=torch.int64, device=dev)
    args = (q, k_buf, v_buf, rt, rows, prefix, ext, starts, 0.125, int(ext.max()))
    torch.testing.assert_close(extend_attention(*args, blocks=blocks), extend_attention(*args), atol=0, rtol=0)
