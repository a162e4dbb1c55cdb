"""Shared-prefix decode attention (kernels/attention/shared_prefix.py through decode_attention's `shared`) equals
plain decode attention (in float32 the dense reference that test_decode_attn_variants.py checks it against): groups
of rows with identical prefix slots, of various sizes (more rows than a tile), prefixes not a multiple of the block,
pages of 1 and 16, GQA groups of 1, 3, 4 and 8, rows one token past their prefix, grouped and ungrouped rows
interleaved. On the CPU under TRITON_INTERPRET=1 (a subprocess), or on CUDA."""
from __future__ import annotations

import math
import random

import pytest
import torch

from tests.runtime.kernels.attention.test_decode_attn_variants import reference
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "shared-prefix cases passed"


def make_case(groups, ungrouped, heads, kv_heads, head_dim, page_size, dtype, device, seed):
    """groups: [(prefix_len, [seq_len of each row])]; ungrouped: [seq_len]. Rows interleaved in a shuffled order;
    a group's rows hold the same slots over [0, prefix_len), their own after it (pages in shuffled order)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    rows = [(gi, p, n) for gi, (p, lens) in enumerate(groups) for n in lens] + [(-1, 0, n) for n in ungrouped]
    rng.shuffle(rows)
    bs = len(rows)
    width = max(n for _, _, n in rows) + page_size
    need = sum(-(-p // page_size) for p, _ in groups) + sum(-(-(n - p) // page_size) + 1 for _, p, n in rows) + 2
    pages = (torch.randperm(need, generator=g) + 1).tolist()
    k_buf = torch.randn((need + 2) * page_size, kv_heads, head_dim, generator=g).to(dtype)
    v_buf = torch.randn((need + 2) * page_size, kv_heads, head_dim, generator=g).to(dtype)

    def take(n):
        own = [pages.pop() for _ in range(-(-n // page_size))]
        return [pg * page_size + j for pg in own for j in range(page_size)][:n]

    prefix_slots = [take(p) for p, _ in groups]
    pool_rows = rng.sample(range(bs + 3), bs)
    req_to_token = torch.zeros(bs + 3, width, dtype=torch.int64)
    members: list[list[int]] = [[] for _ in groups]
    for b, (gi, p, n) in enumerate(rows):
        slots = (prefix_slots[gi] if gi >= 0 else []) + take(n - p)
        req_to_token[pool_rows[b], :n] = torch.tensor(slots)
        if gi >= 0:
            members[gi].append(b)
    q = torch.randn(bs, heads, head_dim, generator=g).to(dtype)
    shared = [(p, m) for (p, _), m in zip(groups, members)]
    lens = torch.tensor([n for _, _, n in rows])
    return [t.to(device) for t in (q, k_buf, v_buf, req_to_token, torch.tensor(pool_rows), lens)], shared


CASES = [
    # (groups, ungrouped, heads, kv_heads, head_dim)
    ([(100, [101, 150, 230])], [], 8, 2, 64),
    ([(300, [301, 301]), (257, [260, 400, 258, 300, 299])], [5, 700, 1], 8, 2, 64),
    ([(64, [65] * 20)], [64, 65], 4, 1, 32),  # 20 rows: two tiles of 16 requests x 4 heads, one kv head
    ([(130, [131, 140]), (200, [201, 333, 202])], [1, 90], 9, 3, 16),
    ([(272, [273, 280, 500])], [17], 4, 4, 32),
    ([(96, [97] * 9)], [], 8, 1, 16),  # 8 heads per kv head: 8 requests a tile
]


def run_cases(device: str) -> None:
    from radixlm.runtime.layers.attention.triton_backend import shared_prefixes
    from radixlm.runtime.kernels.attention.decode import decode_attention
    from radixlm.runtime.kernels.attention.decode_splits import decode_chunk_capacity, decode_num_splits

    for i, (groups, ungrouped, heads, kv_heads, head_dim) in enumerate(CASES):
        # The interpreter's time: on the CPU each case runs one page size (1, 1, 16, 16, 1, 1) and bfloat16 on even
        # cases (so both page sizes meet both dtypes).
        for page_size in (1, 16) if device != "cpu" else ((1, 16)[i // 2 % 2],):
            for dtype in (torch.float32, torch.bfloat16):
                if dtype == torch.bfloat16 and device == "cpu" and i % 2:
                    continue
                (q, k, v, rt, pool, lens), shared = make_case(groups, ungrouped, heads, kv_heads, head_dim,
                                                              page_size, dtype, device, seed=i * 7 + page_size)
                scale = 1 / math.sqrt(head_dim)
                # Every case's batch is one decode_attention chunks (decode_chunk_capacity), which ignores the
                # split count: one reference for all of them. float32's is the dense one (the interpreter's time);
                # the interpreter computes bfloat16 wrongly (test_decode_attn_variants.py), the same in both kernels.
                assert decode_chunk_capacity(len(lens), kv_heads)
                want = (reference(q, k, v, rt, pool, lens, scale) if dtype == torch.float32
                        else decode_attention(q, k, v, rt, pool, lens, scale, int(lens.max())))
                # None takes decode_num_splits' count: a fixed count equal to it would repeat that launch.
                derived = decode_num_splits(int(lens.max()), len(lens), kv_heads)
                for num_splits in (None, *(n for n in (1, 3) if n != derived)):
                    meta = shared_prefixes(shared, len(lens), heads // kv_heads, kv_heads, device)
                    got = decode_attention(q, k, v, rt, pool, lens, scale, int(lens.max()), num_splits, meta)
                    tol = 1e-5 if dtype == torch.float32 else 2e-2
                    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol,
                                               msg=lambda m: f"case {i} page {page_size} {dtype} splits "
                                                             f"{num_splits}: {m}")
                    if dtype == torch.float32:
                        # The prefix partials matter: without them the grouped rows would differ.
                        meta.tile_rows.zero_()
                        bad = decode_attention(q, k, v, rt, pool, lens, scale, int(lens.max()), num_splits, meta)
                        assert not torch.allclose(bad, want, atol=1e-3)
    fp8_case(device)
    print(MARKER)


def fp8_case(device: str) -> None:
    """A float8 pool with K and V scales: the prefix kernel reads stored * scale as the plain decode kernel does."""
    from radixlm.runtime.cache.kv_quant import quantize_kv
    from radixlm.runtime.layers.attention.triton_backend import shared_prefixes
    from radixlm.runtime.kernels.attention.decode import decode_attention

    groups, ungrouped, heads, kv_heads, head_dim = CASES[0]
    (q, k, v, rt, pool, lens), shared = make_case(groups, [9], heads, kv_heads, head_dim, 1, torch.float32, device,
                                                  seed=99)
    k8, v8 = quantize_kv(k, 0.5, torch.float8_e4m3fn), quantize_kv(v, 2.0, torch.float8_e4m3fn)
    scales = dict(k_scale=0.5, v_scale=2.0)
    want = reference(q, k8.float() * 0.5, v8.float() * 2.0, rt, pool, lens, 0.125)
    meta = shared_prefixes(shared, len(lens), heads // kv_heads, kv_heads, device)
    got = decode_attention(q, k8, v8, rt, pool, lens, 0.125, int(lens.max()), 2, meta, **scales)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_shared_prefix_decode_equals_plain_decode_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=900)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_shared_prefix_decode_equals_plain_decode_cuda():
    run_cases("cuda")


if __name__ == "__main__":
    run_cases("cpu")
