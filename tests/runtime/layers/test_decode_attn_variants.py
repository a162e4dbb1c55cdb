"""The decode kernel's launch variants against a dense float32 reference: several splits (stage 2 merges them), one
split (stage 1 writes the output: DIRECT), and a wide pass (decode_wide_rows rows: 128-position blocks); pages of 1
and 16 in shuffled order. On the CPU under TRITON_INTERPRET=1 (a subprocess), or on CUDA."""
from __future__ import annotations

import math

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "decode variants passed"


def make_case(bs, heads, kv_heads, head_dim, max_len, page_size, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, max_len + 1, (bs,), generator=g)
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


def run_cases(device: str) -> None:
    from radixlm.runtime.layers.attention.triton_ops.decode_attention import decode_attention
    from radixlm.runtime.layers.attention.triton_ops.decode_splits import (
        DECODE_WIDE_BLOCK_N, decode_block_n, decode_num_splits, decode_wide_rows)

    cases = [  # (heads, kv_heads, head_dim, bs, max_len, splits)
        (8, 2, 32, 3, 700, None),  # several splits
        (8, 2, 32, 5, 300, 1),  # one split: DIRECT
        (8, 2, 32, 5, 300, 3),
        (32, 32, 16, decode_wide_rows(32), 300, None),  # a wide pass: 128-position blocks, one split
        (12, 4, 16, decode_wide_rows(4), 200, None),  # wide with a GQA group of 3 (padded rows)
    ]
    for i, (heads, kv_heads, head_dim, bs, max_len, splits) in enumerate(cases):
        # The interpreter's time: on the CPU each case runs one page size, alternating (both on CUDA).
        for page_size in (1, 16) if device != "cpu" else ((1, 16)[i % 2],):
            # The interpreter computes bfloat16 wrongly (also the unchanged kernels): bfloat16 on CUDA only.
            for dtype in (torch.float32,) if device == "cpu" else (torch.float32, torch.bfloat16):
                q, k, v, rt, rows, lens = make_case(bs, heads, kv_heads, head_dim, max_len, page_size, dtype, device,
                                                    seed=i * 13 + page_size)
                if splits is None and bs >= decode_wide_rows(kv_heads):
                    assert decode_num_splits(max_len, bs, kv_heads) == 1
                    assert decode_block_n(bs, kv_heads, False) == DECODE_WIDE_BLOCK_N
                scale = 1 / math.sqrt(head_dim)
                got = decode_attention(q, k, v, rt, rows, lens, scale, int(lens.max()), splits)
                want = reference(q, k, v, rt, rows, lens, scale)
                tol = 2e-4 if dtype == torch.float32 else 2e-2
                assert got.dtype == dtype and got.shape == q.shape
                torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol,
                                           msg=lambda m: f"case {i} page {page_size} {dtype}: {m}")
    print(MARKER)


@pytest.mark.skipif(not interpreter_works(), reason="needs triton with its interpreter")
def test_decode_variants_match_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=900)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_decode_variants_match_reference_cuda():
    run_cases("cuda")


if __name__ == "__main__":
    run_cases("cpu")
