"""The decode kernel's launch variants against a dense float32 reference: several splits (stage 2 merges them), one
split (stage 1 writes the output: DIRECT), a wide pass (decode_wide_rows rows: 128-position blocks), and chunked passes
(small batches: a work list of chunks, ragged lengths up to a request with the most entries the list allows); pages of
1 and 16 in shuffled order; and the chunked passes' work lists against their host mirror. On the CPU under
TRITON_INTERPRET=1 (a subprocess), or on CUDA. The host mirror itself is checked here directly."""
from __future__ import annotations

import math

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "decode variants passed"


def make_case(bs, heads, kv_heads, head_dim, max_len, page_size, dtype, device, seed, lens=None):
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, max_len + 1, (bs,), generator=g) if lens is None else torch.tensor(lens)
    max_len = int(seq_lens.max())
    pages_needed = int((-(-seq_lens // page_size)).sum()) + 2
    k_buf = torch.randn(pages_needed * page_size, kv_heads, head_dim, generator=g).to(dtype)
    v_buf = torch.randn(pages_needed * page_size, kv_heads, head_dim, generator=g).to(dtype)
    pages = (torch.randperm(pages_needed - 1, generator=g) + 1).tolist()
    pool_rows = torch.randperm(bs + 3, generator=g)[:bs]
    req_to_token = torch.zeros(bs + 3, max_len + page_size, dtype=torch.int64)
    for i in range(bs):
        n = int(seq_lens[i])
        own = [pages.pop() for _ in range(-(-n // page_size))]
        slots = [p * page_size + j for p in own for j in range(page_size)][:n]
        req_to_token[pool_rows[i], :n] = torch.tensor(slots)
    q = torch.randn(bs, heads, head_dim, generator=g).to(dtype)
    return [t.to(device) for t in (q, k_buf, v_buf, req_to_token, pool_rows, seq_lens)]


def reference(q, k_buf, v_buf, req_to_token, pool_rows, seq_lens, scale):
    out = []
    group = q.shape[1] // k_buf.shape[1]
    for i in range(q.shape[0]):
        slots = req_to_token[pool_rows[i], : int(seq_lens[i])]
        k = k_buf[slots].float().repeat_interleave(group, dim=1)
        v = v_buf[slots].float().repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].float(), k) * scale
        out.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v))
    return torch.stack(out)


def check_work_lists(device: str) -> None:
    """decode_work_list's table against the host mirror (decode_chunk_layout): entries request after request, equal
    parts covering each request, -1 past the list, and each request's first entry and count."""
    import random

    from radixlm.runtime.kernels.attention.decode_splits import (
        DECODE_BLOCK_N, DECODE_CHUNK_MAX_ROWS, decode_chunk_capacity, decode_chunk_layout)
    from radixlm.runtime.kernels.attention.decode_work import decode_work_list

    rng = random.Random(3)
    for trial in range(12):
        bs = rng.choice([2, 3, 7, DECODE_CHUNK_MAX_ROWS])
        lens = [rng.choice([1, rng.randrange(1, 200), rng.randrange(1, 20000)]) for _ in range(bs)]
        capacity = decode_chunk_capacity(bs, 1)
        padded = torch.tensor(lens + [7] * 3, dtype=torch.int64, device=device)[:bs]  # rows past bs are not read
        pool_rows = [rng.randrange(0, 1000) for _ in range(bs)]
        table = decode_work_list(padded, torch.tensor(pool_rows, device=device), bs, capacity).table.cpu().tolist()
        _, counts = decode_chunk_layout(lens, capacity)
        want, firsts = [], []
        for b, (n, c) in enumerate(zip(lens, counts)):
            part = -(-(-(-n // DECODE_BLOCK_N)) // c) * DECODE_BLOCK_N
            firsts.append(len(want))
            want += [(b, pool_rows[b], j * part, min((j + 1) * part, n)) for j in range(c)]
        want += [(-1, None, None, None)] * (capacity - len(want))
        got = list(zip(*(table[i * capacity : (i + 1) * capacity] for i in range(4))))
        assert [g if w[0] >= 0 else (g[0], None, None, None) for g, w in zip(got, want)] == want, (trial, lens)
        per_row = table[4 * capacity :]
        assert per_row[:bs] == firsts and per_row[DECODE_CHUNK_MAX_ROWS : DECODE_CHUNK_MAX_ROWS + bs] == counts


def run_cases(device: str) -> None:
    from radixlm.runtime.kernels.attention.decode import decode_attention

    check_work_lists(device)
    from radixlm.runtime.kernels.attention.decode_splits import (
        DECODE_CHUNK_MAX_ROWS, DECODE_WIDE_BLOCK_N, decode_block_n, decode_chunk_capacity, decode_chunk_layout,
        decode_num_splits, decode_wide_rows)

    most = [48 * 4 * 64 - 64, 1]  # one request with the most entries a list of two rows gives it: 48 of 4 blocks
    assert decode_chunk_layout(most, decode_chunk_capacity(2, 1)) == (4, [48, 1])
    cases = [  # (heads, kv_heads, head_dim, bs, max_len, splits, chunked, lens)
        (8, 2, 32, 3, 700, None, False, None),  # several splits
        (8, 2, 32, 5, 300, 1, False, None),  # one split: DIRECT
        (8, 2, 32, 5, 300, 3, False, None),
        (4, 4, 16, 5, 300, None, False, None),  # a GQA group of 1
        # A wide pass (128-position blocks, one split), with a GQA group of 3 (padded rows). Its 1,024 programs are
        # most of the interpreter's time: one such case, and lengths up to 160 still give rows of two 128-position
        # blocks (checked below).
        (12, 4, 16, decode_wide_rows(4), 160, None, True, None),
        (8, 2, 32, 5, 900, 3, True, None),  # chunked (the split count unused)
        (8, 1, 16, 2, 0, None, True, most),
        (3, 1, 16, DECODE_CHUNK_MAX_ROWS, 300, None, True, None),  # every row of the kernels' request tile
    ]
    for i, (heads, kv_heads, head_dim, bs, max_len, splits, chunked, lens) in enumerate(cases):
        assert not chunked or bool(decode_chunk_capacity(bs, kv_heads)) == (i >= 5), i  # the chunked cases
        # The interpreter's time: on the CPU each case runs one page size, alternating (both on CUDA).
        for page_size in (1, 16) if device != "cpu" else ((1, 16)[i % 2],):
            # The interpreter computes bfloat16 wrongly (also the unchanged kernels): bfloat16 on CUDA only.
            for dtype in (torch.float32,) if device == "cpu" else (torch.float32, torch.bfloat16):
                q, k, v, rt, rows, seq_lens = make_case(bs, heads, kv_heads, head_dim, max_len, page_size, dtype,
                                                        device, seed=i * 13 + page_size, lens=lens)
                if splits is None and bs >= decode_wide_rows(kv_heads):
                    assert decode_num_splits(max_len, bs, kv_heads) == 1
                    assert int(seq_lens.max()) > DECODE_WIDE_BLOCK_N, "no row spans two wide blocks"
                    assert decode_block_n(bs, kv_heads, False) == DECODE_WIDE_BLOCK_N
                scale = 1 / math.sqrt(head_dim)
                got = decode_attention(q, k, v, rt, rows, seq_lens, scale, int(seq_lens.max()), splits,
                                       chunked=chunked)
                want = reference(q, k, v, rt, rows, seq_lens, scale)
                tol = 2e-4 if dtype == torch.float32 else 2e-2
                assert got.dtype == dtype and got.shape == q.shape
                torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol,
                                           msg=lambda m: f"case {i} page {page_size} {dtype}: {m}")
    fp8_cases(device)
    config_cases(device)
    print(MARKER)


def config_cases(device: str) -> None:
    """Every stage-1 launch config (decode_splits.DECODE_VARIANTS: Triton's pipeline or the prefetching walks, 64 or
    128 positions a block) against the reference, split (a split of one request is empty: 3 splits of 2 positions)
    and DIRECT, a model-dtype and a float8 pool; configs of the same block size give the same bits (the prefetching
    walk reads the same blocks in the same order)."""
    from radixlm.runtime.cache.kv_quant import quantize_kv
    from radixlm.runtime.kernels.attention.decode import decode_attention
    from radixlm.runtime.kernels.attention.decode_splits import DECODE_VARIANTS, KvWiden

    # The interpreter ignores warps and stages; the widening configs (test_decode_kv_widen.py) are the query dtype's
    # for float32 queries.
    walks = {(c.block_n, c.prefetch): c for c in DECODE_VARIANTS.values() if c.widen == KvWiden.QUERY}
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    for i, (splits, kv_dtype, lens) in enumerate([(3, None, [2, 300, 129]), (1, torch.float8_e4m3fn, [1, 200, 64])]):
        q, k, v, rt, rows, seq_lens = make_case(3, 8, 2, 16, 0, (1, 16)[i], torch.float32, device, seed=70 + i,
                                                lens=lens)
        scales = {}
        if kv_dtype is not None:
            k, v = quantize_kv(k, 0.5, kv_dtype), quantize_kv(v, 2.0, kv_dtype)
            scales = {"k_scale": 0.5, "v_scale": 2.0}
        want = reference(q.to(dtype), k.float() * scales.get("k_scale", 1.0), v.float() * scales.get("v_scale", 1.0),
                         rt, rows, seq_lens, 0.25)
        by_block: dict[int, torch.Tensor] = {}
        for (block_n, prefetch), config in sorted(walks.items()):
            got = decode_attention(q.to(dtype), k if kv_dtype else k.to(dtype), v if kv_dtype else v.to(dtype), rt,
                                   rows, seq_lens, 0.25, int(seq_lens.max()), splits, chunked=False, config=config,
                                   **scales)
            tol = 2e-4 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol,
                                       msg=lambda m: f"config case {i} {config}: {m}")
            first = by_block.setdefault(block_n, got)
            assert torch.equal(first, got), (i, config)


def fp8_cases(device: str) -> None:
    """A float8 pool (--kv-cache-dtype fp8_*): the kernel reads stored * scale, against the reference on those
    values (and, where the pool's default launch runs Q K^T in FP8, on the query as it rounds it); several splits,
    one (DIRECT) and a chunked pass."""
    from radixlm.runtime.cache.kv_quant import e4m3_query_rows, quantize_kv
    from radixlm.runtime.kernels.attention.decode import decode_attention, fp8_query
    from radixlm.runtime.kernels.attention.decode_splits import KvPool, decode_kernel_config

    cases = [(torch.float8_e4m3fn, 3, 400, None, False), (torch.float8_e5m2, 4, 200, 1, False),
             (torch.float8_e4m3fn, 3, 500, 3, True)]
    for i, (kv_dtype, bs, max_len, splits, chunked) in enumerate(cases):
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        q, k, v, rt, rows, seq_lens = make_case(bs, 8, 2, 32, max_len, (1, 16)[i % 2], torch.float32, device,
                                                seed=50 + i)
        k_scale, v_scale = 0.25, 3.0
        k8, v8 = quantize_kv(k * 2, k_scale, kv_dtype), quantize_kv(v, v_scale, kv_dtype)
        scale = 1 / math.sqrt(32)
        got = decode_attention(q.to(dtype), k8, v8, rt, rows, seq_lens, scale, int(seq_lens.max()), splits,
                               chunked=chunked, k_scale=k_scale, v_scale=v_scale)
        q_ref = q.to(dtype)
        if fp8_query(q_ref, k8, decode_kernel_config(KvPool.of(kv_dtype), False)):  # e4m3's default on CUDA
            q_ref = e4m3_query_rows(q_ref)
        want = reference(q_ref, k8.float() * k_scale, v8.float() * v_scale, rt, rows, seq_lens, scale)
        tol = 2e-4 if dtype == torch.float32 else 3e-2
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol, msg=lambda m: f"fp8 case {i}: {m}")
        # The stored values are not the float ones: within the format's error of them.
        plain = reference(q.to(dtype), k * 2, v, rt, rows, seq_lens, scale)
        assert (got.float() - plain).abs().max() < (0.3 if kv_dtype == torch.float8_e4m3fn else 0.6)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_decode_variants_match_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=900)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_decode_variants_match_reference_cuda():
    run_cases("cuda")


if __name__ == "__main__":
    run_cases("cpu")


@pytest.mark.parametrize("seed", range(20))
def test_chunk_layout_fits_its_capacity_and_covers_every_position(seed):
    import random

    from radixlm.runtime.kernels.attention.decode_splits import (
        DECODE_BLOCK_N, DECODE_CHUNK_MAX_ROWS, decode_chunk_capacity, decode_chunk_layout)

    rng = random.Random(seed)
    kv_heads = rng.choice([1, 2, 4, 8])
    bs = rng.randrange(2, DECODE_CHUNK_MAX_ROWS + 1)
    capacity = decode_chunk_capacity(bs, kv_heads)
    if not capacity:
        assert bs * kv_heads >= 256
        return
    lens = [rng.choice([1, rng.randrange(1, 300), rng.randrange(1, 40000)]) for _ in range(bs)]
    chunk, counts = decode_chunk_layout(lens, capacity, DECODE_BLOCK_N)
    assert sum(counts) <= capacity and max(counts) <= capacity - bs + 1
    for n, c in zip(lens, counts):
        blocks = -(-n // DECODE_BLOCK_N)
        part = -(-blocks // c)  # the kernel's equal parts (blocks): every one holds positions, none past the chunk
        assert (c - 1) * part < blocks <= c * part and part <= chunk
