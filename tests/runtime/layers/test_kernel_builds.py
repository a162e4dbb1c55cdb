"""ParallelBuilds (layers/kernel_builds.py): a discovery run skips the launches of unbuilt kernels and builds them
in a thread pool; the next run finds them built (run on the GPU machine; skipped without CUDA)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def add_const(X, Y, n, C: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(Y + offs, tl.load(X + offs, mask=mask) + C, mask=mask)

    @triton.jit
    def times_two(X, Y, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(Y + offs, tl.load(X + offs, mask=mask) * 2, mask=mask)

    return add_const, times_two


def test_discovery_skips_unbuilt_launches_and_builds_them_in_parallel():
    from triton import knobs

    from radixlm.runtime.layers.kernel_builds import ParallelBuilds

    add_const, times_two = _kernels()
    x = torch.arange(1000, device="cuda", dtype=torch.float32)

    def run():
        outs = []
        for c in (1, 2, 3):
            y = torch.zeros_like(x)
            add_const[(8,)](x, y, x.numel(), C=c, BLOCK=128)
            outs.append(y)
        y = torch.zeros_like(x)
        times_two[(8,)](x, y, x.numel(), BLOCK=128)
        outs.append(y)
        return outs

    builds = ParallelBuilds("cuda", inline=(times_two,))
    with builds.discover():
        skipped = run()
    torch.cuda.synchronize()
    assert all(torch.equal(y, torch.zeros_like(x)) for y in skipped[:3])  # not launched: built in the pool instead
    assert torch.equal(skipped[3], x * 2)  # inline: built and launched there
    assert builds.finish() == 3

    misses = []
    prev = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = lambda **kw: misses.append(kw.get("repr")) or False
    try:
        again = run()
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_cache_hook = prev
    assert misses == []
    for c, y in zip((1, 2, 3), again):
        assert torch.equal(y, x + c)


def test_a_build_that_fails_is_left_to_its_launch():
    from radixlm.runtime.layers.kernel_builds import ParallelBuilds

    builds = ParallelBuilds("cuda")
    builds._builds["bad"] = builds._pool.submit(lambda: 1 / 0)
    assert builds.finish() == 0
