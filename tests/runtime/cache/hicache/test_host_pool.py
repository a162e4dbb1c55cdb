"""The host pool's copies counted (CopyStats): through DMA calls (uva off), a load is one copy per run of consecutive
host slots, not per token or per layer, and fragmented slots are gathered on the host once; the backups queued in a
step are one device gather and one copy per run (through the device's mapping of the pool: test_layer_loads.py);
the values arrive intact either way, once a pass would have waited for the load's layers. And the pool over MLA's
latent layout, with the tree and the file storage. Every row holds (slot, buffer) so a wrong slot shows."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.args import HiCacheStorageBackend, HiCacheWritePolicy
from radixlm.runtime.cache.hicache import HiCacheConfig, HiRadixCache, host_pool as hp
from radixlm.runtime.cache.hicache.host_pool import HostKVPool, contiguous_runs
from radixlm.runtime.cache.kv_pool import MLATokenToKVPool
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool, TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_node import RadixKey

LAYERS = 4


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


def mha_pool(size: int = 256, device: str = "cpu") -> TokenToKVPool:
    pool = TokenToKVPool(size, 1, torch.float32, num_layers=LAYERS, num_kv_heads=2, head_dim=3, device=device)
    for i, b in enumerate(pool.buffers()):  # row s of buffer i holds 1000 * i + s
        b.copy_((torch.arange(b.shape[0], dtype=torch.float32, device=device) + 1000 * i)[:, None, None].expand_as(b))
    return pool


def settle(host: HostKVPool | HiRadixCache) -> None:
    """What a pass does before it reads the loaded KV: take the loads (a tree's deferred ones are issued then) and wait
    for every layer's copies (nothing to wait for on the CPU)."""
    waiter = host.take_layer_loads()
    if waiter is not None:
        waiter.wait_all()


def expected(slots: torch.Tensor, buffers: int) -> torch.Tensor:
    return slots.float()[:, None] + 1000 * torch.arange(buffers).float()


def test_contiguous_runs():
    assert contiguous_runs(torch.tensor([3, 4, 5, 9, 10, 12])) == [(0, 3, 3), (3, 9, 2), (5, 12, 1)]
    assert contiguous_runs(torch.tensor([], dtype=torch.int64)) == []


@pytest.mark.parametrize("device", DEVICES)
def test_a_load_is_one_copy_per_run_of_host_slots_not_per_token_or_layer(device):
    dev = mha_pool(device=device)
    host = HostKVPool(512, dev, uva=False)
    src = torch.arange(1, 201)
    host.backup(src, src + 100)  # host slot s + 100 holds device slot s's rows
    host.flush()
    assert (host.stats.backup_batches, host.stats.d2h_copies) == (1, 1)
    g = torch.Generator().manual_seed(0)

    def load(host_slots: torch.Tensor) -> None:
        dst = torch.randperm(255, generator=g)[: len(host_slots)] + 1
        host.load(host_slots, dst)
        settle(host)
        got = torch.stack([b[dst.to(device), 1, 2] for b in dev.buffers()], dim=1).cpu()
        assert torch.equal(got, expected(host_slots - 100, 2 * LAYERS))

    load(torch.arange(101, 261)[torch.randperm(160, generator=g)])  # one run, shuffled
    assert (host.stats.h2d_copies, host.stats.gathered_loads) == (1, 0)
    load(torch.cat([torch.arange(150, 170), torch.arange(101, 121)]))  # two runs
    assert (host.stats.h2d_copies, host.stats.gathered_loads) == (3, 0)
    load(torch.arange(101, 301, 2))  # every other slot: gathered on the host, one copy
    assert (host.stats.h2d_copies, host.stats.gathered_loads, host.stats.loads) == (4, 1, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_the_backups_of_a_step_are_one_gather_and_one_copy_per_run(monkeypatch, device):
    dev = mha_pool(device=device)
    host = HostKVPool(512, dev, uva=False)
    for i in range(8):  # eight nodes' backups into consecutive host slots: nothing copied until flushed
        host.backup(torch.arange(8) * 3 + i * 24 + 1, torch.arange(8) + 8 * i + 1)
    assert host.stats.d2h_copies == 0 and host.stats.backups == 8
    host.flush()
    assert (host.stats.backup_batches, host.stats.d2h_copies) == (1, 1)
    assert torch.equal(host.read(torch.arange(1, 65))[:, :, 0, 0], expected(torch.arange(64) * 3 + 1, 2 * LAYERS))
    host.backup(torch.arange(1, 33), torch.arange(301, 365, 2))  # every other host slot: one copy, scattered
    host.flush()
    assert (host.stats.d2h_copies, host.stats.scattered_backups) == (2, 1)
    assert torch.equal(host.read(torch.arange(301, 365, 2))[:, :, 0, 1], expected(torch.arange(1, 33), 2 * LAYERS))
    monkeypatch.setattr(hp, "FLUSH_TOKENS", 16)  # batches are bounded: 40 tokens, 3 gathers, whole ones as queued
    host.backup(torch.arange(1, 41), torch.arange(201, 241))
    assert (host.stats.backup_batches, host.stats.d2h_copies, host._queued_tokens) == (4, 4, 8)
    host.flush()
    assert (host.stats.backup_batches, host.stats.d2h_copies, host._queued_tokens) == (5, 5, 0)
    assert torch.equal(host.read(torch.arange(201, 241))[:, :, 1, 1], expected(torch.arange(1, 41), 2 * LAYERS))


@pytest.mark.parametrize("defer", [False, True], ids=["load_at_match", "deferred_loads"])
@pytest.mark.parametrize("device", DEVICES)
def test_eviction_issues_the_queued_backups_before_it_frees_the_device_slots(device, defer):
    rows = ReqToTokenPool(2, 64, device=device)
    alloc = TokenToKVPoolAllocator(32, 1, device=device)
    dev = mha_pool(32, device=device)
    cfg = HiCacheConfig(host_tokens=64, write_policy=HiCacheWritePolicy.WRITE_THROUGH)
    tree = HiRadixCache(rows, alloc, dev, cfg)
    tree.defer_loads = defer  # (CUDA's default: a round's loads are issued when the pass takes them)
    kept = {}
    for start in (0, 100, 200):
        slots = alloc.alloc(8)
        kept[start] = slots.cpu()
        tree.insert(RadixKey(list(range(start, start + 8))), slots)
    assert tree.host_pool.stats.backups == 3 and tree.host_pool.stats.d2h_copies == 0
    tree.evict(24)
    assert tree.host_pool.stats.backup_batches == 1
    for b in dev.buffers():  # whatever ran next rewrote the freed slots
        b.fill_(-1.0)
    m = tree.match_and_load(RadixKey(list(range(100, 108))))
    assert m.length == 8
    settle(tree)  # (the host pool's own events would miss a load the tree has not issued yet)
    got = torch.stack([b[m.device_indices, 0, 0] for b in dev.buffers()], dim=1).cpu()
    assert torch.equal(got, expected(kept[100], 2 * LAYERS))
    tree.check_consistency()


def mla_tree(host: int = 64, **config) -> tuple[HiRadixCache, MLATokenToKVPool, TokenToKVPoolAllocator]:
    alloc = TokenToKVPoolAllocator(32, 1)
    dev = MLATokenToKVPool(32, 1, torch.float32, num_layers=3, kv_lora_rank=5, qk_rope_head_dim=3)
    cfg = HiCacheConfig(host_tokens=host, write_policy=HiCacheWritePolicy.WRITE_BACK, **config)
    return HiRadixCache(ReqToTokenPool(2, 64), alloc, dev, cfg), dev, alloc


def put(dev: MLATokenToKVPool, slots: torch.Tensor, tokens: list[int]) -> None:
    t = torch.tensor(tokens, dtype=torch.float32)[:, None]
    for layer in range(dev.num_layers):
        dev.set_mla_kv_buffer(layer, slots, (t + layer).expand(-1, 5), -(t + layer).expand(-1, 3))


def latent(dev: MLATokenToKVPool, slots: torch.Tensor) -> torch.Tensor:
    return torch.stack([dev.get_latent_buffer(layer)[slots, 0] for layer in range(dev.num_layers)], dim=1)


def test_the_host_pool_holds_mla_latent_rows_through_eviction_and_load(tmp_path):
    tree, dev, alloc = mla_tree(storage_backend=HiCacheStorageBackend.FILE, storage_dir=tmp_path,
                                storage_page_tokens=8)
    assert tree.host_pool.kv.shape == (65, 3, 1, 8)
    assert tree.host_pool.mem_bytes() == 65 * dev.layout.bytes_per_token
    a = list(range(100, 116))
    slots = alloc.alloc(16)
    put(dev, slots, a)
    want = latent(dev, slots).clone()
    tree.insert(RadixKey(a), slots)
    tree.evict(alloc.size)  # write_back: copied to the host now, the device slots freed
    dev.kv_buffer[0].zero_()
    put(dev, alloc.alloc(alloc.available_size()), [0] * 32)  # every device slot rewritten
    alloc.clear()
    m = tree.match_and_load(RadixKey(a))
    assert m.length == 16 and tree.tier_stats()["host_loaded_tokens"] == 16
    assert torch.equal(latent(dev, m.device_indices), want)
    tree.check_consistency()
    # The file backend keeps MLA pages too (one buffer per layer, row (1, rank + rope)).
    layout = tree.storage.io.storage.layout
    assert (layout.rows, layout.heads, layout.dim) == (3, 1, 8)


def test_a_host_pool_too_small_for_two_pages_is_refused():
    with pytest.raises(ValueError, match="at least two pages"):
        HostKVPool(1, mha_pool(8))
