"""The MLA kernels (kernels/attention/mla*.py) against a dense float32 reference written here: decode (one split:
DIRECT; several; more splits than a short request has blocks; a padded row of length 0; a float8 pool with its
scale; head counts that leave a head block part empty) and extend (prefix reuse, causal new tokens, blocks of several
tokens x heads). On the CPU under TRITON_INTERPRET=1 (one subprocess, tiny shapes, float32: the interpreter computes
bfloat16 wrongly), or on CUDA at DeepSeek's widths (R 512, P 64, 16 and 128 heads, bfloat16). The host-side sizing
and checks run directly."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "mla kernels passed"


def make_pool(lens, rank, rope, page_size, kv_dtype, device, seed, kv_scale=1.0):
    """A latent pool holding every request's positions on shuffled pages (slot 0 unused), its req_to_token and
    pool rows."""
    g = torch.Generator().manual_seed(seed)
    pages = sum(-(-n // page_size) for n in lens) + 2
    kv = torch.randn(pages * page_size, 1, rank + rope, generator=g)
    if kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        kv = (kv / kv_scale).to(kv_dtype)
    else:
        kv = kv.to(kv_dtype)
    free = (torch.randperm(pages - 1, generator=g) + 1).tolist()
    rows = torch.randperm(len(lens) + 3, generator=g)[: len(lens)]
    req_to_token = torch.zeros(len(lens) + 3, max(lens, default=0) + page_size, dtype=torch.int64)
    for i, n in enumerate(lens):
        own = [free.pop() for _ in range(-(-n // page_size))]
        slots = [p * page_size + j for p in own for j in range(page_size)][:n]
        req_to_token[rows[i], :n] = torch.tensor(slots, dtype=torch.int64)
    return kv.to(device), req_to_token.to(device), rows.to(device)


def reference(q, kv, req_to_token, rows, prefix_lens, extend_lens, rank, sm_scale, kv_scale=1.0, trees=None):
    """q: (sum(extend_lens), H, R + P); request i's new token j at position prefix + j sees positions <= it, or with
    trees[i] = (start, bits (ext, prefix + ext - start) bool) keys before start and those its row of bits names."""
    out, t = [], 0
    for i, (prefix, ext) in enumerate(zip(prefix_lens, extend_lens)):
        keys = kv[req_to_token[rows[i], : prefix + ext], 0].float() * kv_scale  # (n, R + P)
        s = torch.einsum("thd,nd->thn", q[t : t + ext].float(), keys) * sm_scale
        pos = torch.arange(prefix + ext, device=q.device)
        visible = pos[None, :] <= (prefix + torch.arange(ext, device=q.device))[:, None]
        if trees is not None and trees[i] is not None:
            start, bits = trees[i]
            visible = torch.cat([torch.ones(ext, start, dtype=torch.bool, device=q.device), bits.to(q.device)], 1)
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        out.append(torch.einsum("thn,nr->thr", s.softmax(-1), keys[:, :rank]))
        t += ext
    return torch.cat(out) if out else q.new_zeros(0, q.shape[1], rank, dtype=torch.float32)


def decode_cases(device, rank, rope, dtype, cases, tol):
    from radixlm.runtime.kernels.attention.mla import MlaDecodeConfig, mla_decode

    for i, (heads, lens, page_size, splits, kv_dtype, config) in enumerate(cases):
        kv_scale = 0.5 if kv_dtype != dtype else 1.0
        kv, rt, rows = make_pool(lens, rank, rope, page_size, kv_dtype, device, seed=i, kv_scale=kv_scale)
        g = torch.Generator().manual_seed(100 + i)
        q = torch.randn(len(lens), heads, rank + rope, generator=g).to(dtype).to(device)
        seq_lens = torch.tensor(lens, device=device)
        scale = (rank + rope) ** -0.5
        out = torch.full((len(lens), heads, rank), float("nan"), dtype=dtype, device=device)
        got = mla_decode(q, kv, rt, rows, seq_lens, scale, out, num_kv_splits=splits, max_seq_len=max(lens),
                         kv_scale=kv_scale, config=MlaDecodeConfig(**config))
        assert got is out
        live = [n > 0 for n in lens]
        want = torch.zeros(len(lens), heads, rank, device=device)
        want[live] = reference(q[live], kv, rt, rows[live], [n - 1 for n in lens if n], [1] * sum(live), rank,
                               scale, kv_scale)
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol, msg=lambda m: f"decode case {i}: {m}")


def extend_cases(device, rank, rope, dtype, cases, tol):
    from radixlm.runtime.kernels.attention.mla import MlaExtendConfig, mla_extend, mla_extend_blocks

    for i, (heads, lens, page_size, config, kv_dtype) in enumerate(cases):
        totals = [p + e for p, e in lens]
        kv_scale = 0.5 if kv_dtype != dtype else 1.0
        kv, rt, rows = make_pool(totals, rank, rope, page_size, kv_dtype, device, seed=50 + i, kv_scale=kv_scale)
        ext = [e for _, e in lens]
        g = torch.Generator().manual_seed(150 + i)
        q = torch.randn(sum(ext), heads, rank + rope, generator=g).to(dtype).to(device)
        ext_t = torch.tensor(ext, device=device)
        starts = torch.cumsum(ext_t, 0) - ext_t
        prefix = torch.tensor([p for p, _ in lens], device=device)
        scale = (rank + rope) ** -0.5
        out = torch.full((sum(ext), heads, rank), float("nan"), dtype=dtype, device=device)
        blocks = None
        if config is not None:  # the backend's way: the list built on the host, at the kernel's block_m
            config = MlaExtendConfig(**config)
            blocks = torch.tensor(mla_extend_blocks(ext, config), dtype=torch.int64, device=device)
        got = mla_extend(q, kv, rt, rows, prefix, ext_t, starts, scale, out, blocks=blocks, kv_scale=kv_scale,
                         config=config)
        want = reference(q, kv, rt, rows, [p for p, _ in lens], ext, rank, scale, kv_scale)
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol, msg=lambda m: f"extend case {i}: {m}")


def tree_cases(device: str, rank: int, rope: int, dtype, tol: float) -> None:
    """Tree drafts' masks beside causal requests: a tree over the new tokens; a mask from inside the prefix; one
    letting each new token see itself alone (rows that see no key of a whole block); a causal request (offset -1)."""
    from radixlm.runtime.kernels.attention.mla import MlaExtendConfig, mla_extend

    g = torch.Generator().manual_seed(7)
    lens = [(20, 6), (5, 4), (10, 3), (0, 20)]
    starts_of = [20, None, 4, 0]
    trees, flat, offsets = [], [], []
    for (prefix, ext), start in zip(lens, starts_of):
        if start is None:
            trees.append(None)
            offsets.append(-1)
            continue
        width = prefix + ext - start
        bits = torch.rand(ext, width, generator=g) < 0.5
        if start == 0:
            bits = torch.zeros(ext, width, dtype=torch.bool)
        bits[torch.arange(ext), prefix - start + torch.arange(ext)] = True  # every token sees itself
        trees.append((start, bits))
        offsets.append(sum(f.numel() for f in flat))
        flat.append(bits.reshape(-1))
    kv, rt, rows = make_pool([p + e for p, e in lens], rank, rope, 1, dtype, device, seed=77)
    ext = [e for _, e in lens]
    q = torch.randn(sum(ext), 4, rank + rope, generator=g).to(dtype).to(device)
    ext_t = torch.tensor(ext, device=device)
    out = torch.full((sum(ext), 4, rank), float("nan"), dtype=dtype, device=device)
    scale = (rank + rope) ** -0.5
    got = mla_extend(q, kv, rt, rows, torch.tensor([p for p, _ in lens], device=device), ext_t,
                     torch.cumsum(ext_t, 0) - ext_t, scale, out, config=MlaExtendConfig(4, 4, 16),
                     custom_mask=torch.cat(flat).to(device),
                     mask_starts=torch.tensor([s or 0 for s in starts_of], device=device),
                     mask_offsets=torch.tensor(offsets, device=device))
    want = reference(q, kv, rt, rows, [p for p, _ in lens], ext, rank, scale, trees=trees)
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def run_cases(device: str) -> None:
    if device == "cpu":
        e4m3 = torch.float8_e4m3fn
        f32, n16 = torch.float32, {"block_n": 16}
        decode_cases(device, 32, 16, f32, [  # (heads, lens, page, splits, kv dtype, config)
            (4, [1, 70, 33], 1, 1, f32, n16),  # DIRECT
            (16, [120, 5, 64], 4, 3, f32, {"block_n": 32}),  # three splits of whole blocks; a short one's empty ones
            (20, [40, 0], 1, None, f32, n16),  # two head blocks (the second part empty); a row of length 0
            (4, [90, 17], 16, 4, e4m3, n16),  # a float8 pool read as stored x kv_scale
        ], tol=2e-4)
        decode_cases(device, 64, 16, f32, [(2, [50], 1, 2, f32, n16)], tol=2e-4)
        decode_cases(device, 48, 32, f32, [(3, [40, 9], 1, 2, f32, n16)], tol=2e-4)  # widths padded to powers of 2
        extend_cases(device, 48, 32, f32, [(3, [(20, 6)], 1, None, f32)], tol=2e-4)
        tree_cases(device, 32, 16, f32, tol=2e-4)
        extend_cases(device, 32, 16, f32, [  # (heads, [(prefix, extend)], page, config, kv dtype)
            (4, [(0, 1), (0, 37), (100, 1), (9, 12)], 1, None, f32),  # default: 4 heads x 8 tokens a program
            (3, [(33, 20), (0, 5)], 16, {"block_h": 4, "block_m": 4, "block_n": 16}, e4m3),  # a padded head a block
            (16, [(70, 3)], 1, {"block_h": 8, "block_m": 2, "block_n": 32}, f32),  # two head blocks
        ], tol=2e-4)
    else:
        bf16 = torch.bfloat16
        for heads in (16, 128):
            e4m3 = torch.float8_e4m3fn
            decode_cases(device, 512, 64, bf16, [  # the defaults, then configs the benchmark sweeps
                (heads, [1, 1000, 4097, 64], 1, None, bf16, {}),
                (heads, [300, 7, 2048], 16, 1, bf16, {"block_h": 64, "num_warps": 8, "num_stages": 3}),
                (heads, [300, 7, 2048], 16, 7, bf16, {"block_h": 32, "block_n": 64, "num_warps": 8}),
                (heads, [515, 0, 1], 1, 32, e4m3, {"num_stages": 3}),  # converted inline
                (heads, [515, 0, 1], 1, 3, e4m3, {"block_h": 32, "num_warps": 8, "inline_cvt": False}),
            ], tol=2e-2)
            extend_cases(device, 512, 64, bf16, [
                (heads, [(0, 1), (0, 300), (1000, 1), (64, 64), (130, 17)], 1, None, bf16),
                (heads, [(2000, 5), (0, 129)], 16, {"block_h": 16, "block_m": 4, "block_n": 64}, bf16),
                (heads, [(200, 50), (0, 7)], 1, {"inline_cvt": True}, e4m3),
            ], tol=2e-2)
        tree_cases(device, 512, 64, bf16, tol=2e-2)
    warm_up_cases(device)
    print(MARKER)


def warm_up_cases(device: str) -> None:
    """warm_up_mla runs every variant on a pool it leaves as it was."""
    from radixlm.runtime.kernels.attention import warm_up_mla

    rank, rope, heads = (32, 16, 4) if device == "cpu" else (512, 64, 16)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    kv, rt, _ = make_pool([5, 9], rank, rope, 1, dtype, device, seed=9)
    before = kv.clone()
    warm_up_mla(kv, rt, heads, rank, dtype, tree_masks=True)
    assert torch.equal(kv, before)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_mla_kernels_match_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=300)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_mla_kernels_match_reference_cuda():
    run_cases("cuda")


if __name__ == "__main__":
    run_cases("cpu")


def test_decode_splits_fill_the_gpu_once_and_stay_long():
    from radixlm.runtime.kernels.attention.mla import (
        MLA_MAX_SPLITS, MLA_MIN_SPLIT_LEN, MLA_TARGET_PROGRAMS, MlaDecodeConfig, mla_decode_config,
        mla_decode_num_splits)

    assert mla_decode_num_splits(1, 16) == MLA_MAX_SPLITS  # a graph sized by the context: no length bound
    assert mla_decode_num_splits(1, 16, 1000) == -(-1000 // MLA_MIN_SPLIT_LEN)
    assert mla_decode_num_splits(1, 128, 1 << 20, MlaDecodeConfig(block_h=16)) == -(-MLA_TARGET_PROGRAMS // 8)
    blocks = 128 // mla_decode_config(128).block_h  # the default's head blocks at 128 heads
    assert mla_decode_num_splits(1, 128, 1 << 20) == min(MLA_MAX_SPLITS, -(-MLA_TARGET_PROGRAMS // blocks))
    assert mla_decode_num_splits(32, 16, 4096) == -(-MLA_TARGET_PROGRAMS // 32)
    assert mla_decode_num_splits(256, 128, 4096) == 1 and mla_decode_num_splits(1, 16, 1) == 1
    with pytest.raises(ValueError):
        mla_decode_num_splits(0, 16)


def test_configs_and_shapes_are_checked():
    from radixlm.runtime.kernels.attention.mla import (
        MlaDecodeConfig, MlaExtendConfig, check_mla_args, mla_extend_config)

    for bad in ({"block_h": 8}, {"block_n": 48}, {"num_warps": 3}, {"num_stages": 0}):
        with pytest.raises(ValueError):
            MlaDecodeConfig(**bad)
    for bad in ({"block_h": 2, "block_m": 4}, {"block_h": 3}, {"block_n": 8}, {"block_h": 64, "block_m": 4}):
        with pytest.raises(ValueError):
            MlaExtendConfig(**bad)
    assert [(c.block_h, c.block_m) for c in map(mla_extend_config, (1, 3, 16, 128))] == [(1, 64), (4, 16), (16, 4),
                                                                                          (16, 4)]
    q, kv, out = torch.zeros(2, 4, 80), torch.zeros(10, 1, 80), torch.zeros(2, 4, 64)
    assert check_mla_args(q, kv, out) == (64, 16)
    for args in [(q, torch.zeros(10, 2, 80), out), (q, kv, torch.zeros(2, 4, 60)), (q, kv.half(), out),
                 (q, torch.zeros(10, 1, 72), out), (q.half(), kv.half(), out)]:
        with pytest.raises(ValueError):
            check_mla_args(*args)


def _built() -> int:
    import importlib

    dec, ext = (importlib.import_module(f"radixlm.runtime.kernels.attention.{m}") for m in ("mla_decode", "mla_extend"))
    kernels = (dec._mla_decode_stage1, dec._mla_decode_stage2, ext._mla_extend_kernel)
    return sum(len(cache[0]) for k in kernels for cache in k.device_caches.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_no_build_after_warm_up_and_graph_replays_any_lengths():
    """After warm_up_mla no pass builds a kernel (split counts, lengths, index views at any offset); a CUDA graph of
    a decode pass at a fixed split count replays other lengths as an eager pass computes them."""
    from radixlm.runtime.kernels.attention.mla import mla_decode, mla_extend, warm_up_mla

    dev, bf16, heads = "cuda", torch.bfloat16, 16
    lens = [700, 3, 1500, 64]
    kv, rt, rows = make_pool(lens, 512, 64, 1, bf16, dev, seed=5)
    warm_up_mla(kv, rt, heads, 512, bf16, tree_masks=True)
    built = _built()
    q = torch.randn(len(lens), heads, 576, device=dev, dtype=bf16)
    out = torch.empty(len(lens), heads, 512, device=dev, dtype=bf16)
    index = torch.tensor([0] + lens, device=dev)[1:]  # at an odd offset
    pool_rows = torch.cat([rows[:1], rows])[1:]
    for splits in (1, 2, 3, 5, 16, 32, None):
        mla_decode(q, kv, rt, pool_rows, index, 0.1, out, num_kv_splits=splits, max_seq_len=max(lens))
    ext = torch.tensor([0, 1, 2, 5], device=dev)[1:]
    q8 = torch.randn(8, heads, 576, device=dev, dtype=bf16)
    mla_extend(q8, kv, rt, pool_rows[:3], index[:3] - ext, ext, torch.tensor([0, 1, 3], device=dev), 0.1,
               torch.empty(8, heads, 512, device=dev, dtype=bf16))
    assert _built() == built

    seq_lens = torch.tensor(lens, device=dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_decode(q, kv, rt, rows, seq_lens, 0.1, out, num_kv_splits=8)
    for new in ([1, 1, 1, 1], [1500, 700, 64, 3]):
        seq_lens.copy_(torch.tensor(new))
        graph.replay()
        want = mla_decode(q, kv, rt, rows, seq_lens, 0.1, torch.empty_like(out), num_kv_splits=8)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
