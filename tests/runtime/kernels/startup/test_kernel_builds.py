"""ParallelBuilds (startup/kernel_builds.py): a discovery run skips the launches of unbuilt kernels and builds them
in a thread pool; the next run finds them built. The rule through Triton's JIT cache hook as Triton calls it
(keywords only) with stand-in JIT functions, on any machine; real kernels on the GPU machine."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class FakeJit:
    def __init__(self, fail: bool = False):
        self.preloaded: list[str] = []
        self.fail = fail

    def preload(self, data: str):
        if self.fail:
            raise RuntimeError("no such target")
        self.preloaded.append(data)
        return SimpleNamespace()  # no _init_handles: left to the first launch


def _call(fn, key, manual=False, data="spec"):
    return triton.knobs.runtime.jit_cache_hook(
        key=key, repr=f"k[{key}]", fn=SimpleNamespace(module="m", name="k", jit_function=fn),
        compile={"key": key, "specialization_data": data}, is_manual_warmup=manual, already_compiled=False)


def test_discovery_skips_unbuilt_launches_once_each_and_builds_them():
    from radixlm.runtime.kernels.startup.kernel_builds import ParallelBuilds

    kernel, autotuned = FakeJit(), FakeJit()
    builds = ParallelBuilds("cpu", inline=(autotuned,))
    before = triton.knobs.runtime.jit_cache_hook
    with builds.discover():
        assert _call(kernel, "a", data="A") is True  # skipped: built in the pool
        assert _call(kernel, "a", data="A") is True  # the same variant again: one build
        assert _call(kernel, "b", data="B") is True
        assert _call(kernel, "c", manual=True) is False  # a warm-up (our own preload): builds where it is
        assert _call(autotuned, "a") is False  # inline: its launch builds it and runs
    assert triton.knobs.runtime.jit_cache_hook is before
    assert builds.finish() == 2
    assert sorted(kernel.preloaded) == ["A", "B"] and autotuned.preloaded == []


def test_a_hook_already_set_is_asked_first_and_its_skip_holds():
    from radixlm.runtime.kernels.startup.kernel_builds import ParallelBuilds

    seen = []
    prev = triton.knobs.runtime.jit_cache_hook
    triton.knobs.runtime.jit_cache_hook = lambda **kw: seen.append(kw["key"]) or kw["key"] == "skip"
    try:
        kernel = FakeJit()
        builds = ParallelBuilds("cpu")
        with builds.discover():
            assert _call(kernel, "skip") is True
            assert _call(kernel, "x") is True
        assert builds.finish() == 1 and kernel.preloaded == ["spec"]
        assert seen == ["skip", "x"]
    finally:
        triton.knobs.runtime.jit_cache_hook = prev


def test_failed_builds_are_counted_out_and_submitted_ones_run():
    from radixlm.runtime.kernels.startup.kernel_builds import ParallelBuilds

    builds = ParallelBuilds("cpu")
    with builds.discover():
        _call(FakeJit(fail=True), "a")
    ran = []
    builds.submit(ran.append, 7)
    assert builds.finish() == 1 and ran == [7]


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


@needs_cuda
def test_discovery_skips_unbuilt_launches_and_builds_them_in_parallel():
    from triton import knobs

    from radixlm.runtime.kernels.startup.kernel_builds import ParallelBuilds

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


@needs_cuda
def test_submitted_builds_run_in_the_pool_on_the_engines_device():
    from radixlm.runtime.kernels.startup.kernel_builds import ParallelBuilds

    seen = []
    builds = ParallelBuilds(torch.device("cuda", torch.cuda.device_count() - 1))
    for i in range(3):
        builds.submit(lambda i: seen.append((i, torch.cuda.current_device())), i)
    assert builds.finish() == 3
    assert sorted(seen) == [(i, torch.cuda.device_count() - 1) for i in range(3)]


def test_the_warmup_builds_the_collective_norm_kernel_inline(monkeypatch):
    """A discovery run must never skip the fused all-reduce + norm: a rank that skipped its launch while its peer, whose
    build had finished, launched it left the peer waiting forever (a float32 TP=2 start on 2 x H200)."""
    from radixlm.runtime.kernels import elementwise
    from radixlm.runtime.kernels.startup import warmup

    class Stop(Exception):
        pass

    seen = {}

    def record(device, inline=()):
        seen["inline"] = inline
        raise Stop

    monkeypatch.setattr(warmup, "ParallelBuilds", record)
    with pytest.raises(Stop):
        warmup.build_in_parallel(SimpleNamespace(device="cpu"), None)
    assert set(elementwise.inline_builds()) <= set(seen["inline"])
