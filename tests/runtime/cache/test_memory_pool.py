import pytest
import torch

from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool, TokenToKVPoolAllocator

torch.set_num_threads(1)


def test_req_to_token_pool_alloc_free():
    pool = ReqToTokenPool(size=3, max_context_len=8, device="cpu")
    assert pool.req_to_token.shape == (3, 8) and pool.req_to_token.dtype == torch.int64
    rows = [pool.alloc() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2] and pool.alloc() is None and pool.available_size() == 0
    pool.free(rows[1])
    assert pool.available_size() == 1 and pool.alloc() == rows[1]
    pool.free(rows[0])
    with pytest.raises(RuntimeError):
        pool.free(rows[0])


def test_flat_index_reads_and_writes_the_spans_entries():
    pool = ReqToTokenPool(size=3, max_context_len=8)
    pool.req_to_token.copy_(torch.arange(24).reshape(3, 8) * 10)
    spans = [(2, 5, 8), (0, 0, 2), (1, 3, 3)]  # the last one is empty
    index = pool.flat_index(spans)
    assert pool.req_to_token.view(-1)[index].tolist() == [210, 220, 230, 0, 10]
    pool.req_to_token.view(-1).index_copy_(0, index, torch.tensor([-1, -2, -3, -4, -5]))
    assert pool.req_to_token[2, 5:].tolist() == [-1, -2, -3] and pool.req_to_token[0, :2].tolist() == [-4, -5]


def test_token_to_kv_pool_shapes_and_set():
    pool = TokenToKVPool(size=8, page_size=4, dtype=torch.float16, num_layers=2, num_kv_heads=2, head_dim=3,
                         device="cpu")
    assert pool.get_key_buffer(0).shape == (12, 2, 3) and pool.get_value_buffer(1).dtype == torch.float16
    loc = torch.tensor([5, 9])
    k = torch.randn(2, 6)  # flattened heads, float32: cast to the pool dtype
    v = torch.randn(2, 2, 3)
    pool.set_kv_buffer(1, loc, k, v)
    assert torch.allclose(pool.get_key_buffer(1)[loc].float(), k.view(2, 2, 3).half().float())
    assert torch.equal(pool.get_value_buffer(1)[loc], v.half())
    assert pool.get_key_buffer(0).abs().sum() == 0
    assert pool.mem_bytes() == 2 * 2 * 12 * 2 * 3 * 2


def test_alloc_whole_pages_and_free():
    a = TokenToKVPoolAllocator(size=16, page_size=4, device="cpu")
    assert a.available_size() == 16
    x = a.alloc(8)
    assert x.tolist() == list(range(4, 12))  # page 0 is the dummy page
    assert a.available_size() == 8
    with pytest.raises(ValueError):
        a.alloc(3)
    assert a.alloc(12) is None and a.available_size() == 8
    a.free(x[5:6])  # one slot frees its whole page
    assert a.available_size() == 12
    a.free(x[:4])
    assert a.available_size() == 16
    a.check_no_double_free()


def test_page_size_one_slots_never_dummy():
    a = TokenToKVPoolAllocator(size=5, page_size=1, device="cpu")
    x = a.alloc(5)
    assert sorted(x.tolist()) == [1, 2, 3, 4, 5] and a.alloc(1) is None
    a.free(x[[0, 2]])
    assert a.available_size() == 2


def _check_alignment(slots: torch.Tensor, positions: list[int], ps: int):
    for s, p in zip(slots.tolist(), positions):
        assert s % ps == p % ps and s >= ps


def test_alloc_extend_continues_partial_page():
    ps = 4
    a = TokenToKVPoolAllocator(size=32, page_size=ps, device="cpu")
    # Request 0: fresh, 6 tokens; request 1: fresh, 1 token.
    out = a.alloc_extend([0, 0], [6, 1], [-1, -1])
    assert out.numel() == 7 and a.available_size() == 32 - 3 * ps
    r0, r1 = out[:6], out[6:]
    _check_alignment(r0, list(range(6)), ps)
    _check_alignment(r1, [0], ps)
    assert (r0[1:4] - r0[:3]).eq(1).all() and (r0[5] - r0[4]) == 1
    # Extend r0 to 11 (continue page of positions 4..7, then one fresh page); r1 decodes one token.
    out2 = a.alloc_extend([6, 1], [11, 2], [int(r0[-1]), int(r1[-1])])
    assert out2.numel() == 6 and a.available_size() == 32 - 4 * ps
    assert out2[:2].tolist() == [int(r0[-1]) + 1, int(r0[-1]) + 2]
    _check_alignment(out2[:5], list(range(6, 11)), ps)
    assert int(out2[5]) == int(r1[0]) + 1
    # Decode at a page boundary takes a fresh page.
    out3 = a.alloc_extend([4], [5], [int(r1[0]) + 3])
    assert int(out3[0]) % ps == 0 and a.available_size() == 32 - 5 * ps


def test_alloc_extend_all_or_nothing():
    a = TokenToKVPoolAllocator(size=16, page_size=4, device="cpu")
    a.alloc(8)
    free_before = a.free_pages.clone()
    assert a.alloc_extend([0, 0], [5, 4], [-1, -1]) is None  # needs 3 pages, only 2 free
    assert a.available_size() == 8 and torch.equal(a.free_pages, free_before)
    # Continuation within the last page needs no fresh page even when none are free.
    x = a.alloc_extend([0], [7], [-1])
    assert x.numel() == 7 and a.available_size() == 0
    y = a.alloc_extend([7], [8], [int(x[-1])])
    assert y.tolist() == [int(x[-1]) + 1]
    assert a.alloc_extend([8], [9], [int(y[-1])]) is None


def test_alloc_extend_page_size_one():
    a = TokenToKVPoolAllocator(size=10, page_size=1, device="cpu")
    out = a.alloc_extend([0, 3], [4, 5], [-1, 7])
    assert out.numel() == 6 and len(set(out.tolist())) == 6
    assert a.alloc_extend([0], [5], [-1]) is None and a.available_size() == 4


def test_alloc_extend_rejects_misaligned_last_loc():
    a = TokenToKVPoolAllocator(size=16, page_size=4, device="cpu")
    with pytest.raises(ValueError):
        a.alloc_extend([2], [3], [6])  # position 1 cannot live at slot 6 (6 % 4 == 2)


def test_double_free_detected():
    for ps in (1, 4):
        a = TokenToKVPoolAllocator(size=16, page_size=ps, device="cpu")
        x = a.alloc(8)
        a.free(x)
        with pytest.raises(RuntimeError):
            a.free(x[:1])
        with pytest.raises(RuntimeError):
            a.free(torch.tensor([0]))  # dummy page
        a.check_no_double_free()
    a = TokenToKVPoolAllocator(size=4, page_size=1, device="cpu")
    x = a.alloc(2)
    with pytest.raises(RuntimeError):
        a.free(torch.cat([x, x[:1]]))


def test_clear_restores_everything():
    a = TokenToKVPoolAllocator(size=16, page_size=4, device="cpu")
    a.alloc(12)
    a.clear()
    assert a.available_size() == 16
    a.check_no_double_free()


@pytest.mark.parametrize("page_size", [1, 4])
def test_queued_frees_match_eager_frees(page_size):
    """debug=False queues frees and merges them when an allocation needs them; the pool it exposes (sizes, free
    pages, page_is_free) is the eager one's at every step."""
    import random

    rng = random.Random(page_size)
    eager = TokenToKVPoolAllocator(256, page_size, "cpu", debug=True)
    lazy = TokenToKVPoolAllocator(256, page_size, "cpu", debug=False)
    held: list[tuple[torch.Tensor, torch.Tensor]] = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            a, b = held.pop(rng.randrange(len(held)))
            eager.free(a)
            lazy.free(b)
        else:
            n = rng.randrange(1, 12) * page_size
            a, b = eager.alloc(n), lazy.alloc(n)
            assert (a is None) == (b is None)
            if a is not None:
                held.append((a, b))
        assert eager.available_size() == lazy.available_size()
    assert sorted(eager.free_pages.tolist()) == sorted(lazy.free_pages.tolist())
    assert torch.equal(eager.page_is_free, lazy.page_is_free)
    lazy.check_no_double_free()


def test_the_buffers_are_aligned_views_of_one_allocation_and_stacked_indexes_them_all():
    pool = TokenToKVPool(10, 1, torch.float32, num_layers=3, num_kv_heads=1, head_dim=3)  # rows of 12 bytes
    stack, bufs = pool.stacked(), pool.buffers()
    assert stack.shape == (6, 11, 1, 3) and len(bufs) == 6
    for i, b in enumerate(bufs):
        assert b.is_contiguous() and (b.data_ptr() - stack.data_ptr()) % 512 == 0
        b.fill_(float(i))
    assert torch.equal(stack[:, 4, 0, 0], torch.arange(6.0))
    stack.transpose(0, 1).index_copy_(0, torch.tensor([2]), torch.full((1, 6, 1, 3), -1.0))
    assert all(bool((b[2] == -1).all()) for b in bufs) and pool.v_buffer[0][3, 0, 0] == 3.0
    pool.release()
    with pytest.raises(RuntimeError, match="no longer views"):
        pool.stacked()
    pool.resume()
    assert pool.stacked().data_ptr() == pool.k_buffer[0].data_ptr() and pool.mem_bytes() == 6 * 11 * 3 * 4
