"""The extend kernel's work list (extend_blocks.py): every block that holds new tokens once, no other."""
from __future__ import annotations

import random

from radixlm.runtime.kernels.attention.extend_blocks import extend_block_m, extend_blocks


def test_block_m_follows_the_longest_extend():
    assert extend_block_m(1) == extend_block_m(16) == 16
    assert extend_block_m(17) == extend_block_m(8192) == 64


def test_every_block_with_new_tokens_once_request_by_request():
    rng = random.Random(0)
    for _ in range(200):
        lens = [rng.choice([0, 1, 15, 16, 17, 64, 65, rng.randrange(0, 3000)]) for _ in range(rng.randrange(1, 40))]
        bm = extend_block_m(max(lens))
        flat = extend_blocks(lens, bm)
        pairs = list(zip(flat[::2], flat[1::2]))
        assert pairs == [(i, m) for i, n in enumerate(lens) for m in range(-(-n // bm))]
        assert all(m * bm < lens[i] for i, m in pairs)  # no entry without new tokens (the kernel would return)


def test_empty_extends_give_an_empty_list():
    assert extend_blocks([0, 0], 16) == []
    assert extend_blocks([], 64) == []
