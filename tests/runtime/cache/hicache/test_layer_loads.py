"""Loads back from the host pool arrive layer by layer: a pass's attention of layer i waits for layer i's event only
(LayerLoadWaiter), before it stores or reads that layer's KV; device slots a load writes are not reused before it
ends; through the device's mapping of the pool (uva, CUDA) a load is one gather kernel per layer and a backup one
scatter kernel, however scattered the host slots."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixlm.runtime.args import HiCacheWritePolicy
from radixlm.runtime.cache.hicache import HiCacheConfig, HiRadixCache
from radixlm.runtime.cache.hicache.host_memory import as_words
from radixlm.runtime.cache.hicache.host_pool import HostKVPool
from radixlm.runtime.cache.layer_load import LayerLoadWaiter
from radixlm.runtime.cache.kv_pool import MLATokenToKVPool
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.cache.radix_node import RadixKey
from radixlm.runtime.layers.radix_attention import RadixAttention
from tests.runtime.cache.hicache.test_host_pool import LAYERS, expected, mha_pool

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class _Stream:
    def __init__(self):
        self.waited: list[str] = []

    def wait_event(self, event: str) -> None:
        self.waited.append(event)


def test_the_waiter_orders_a_layer_once_and_an_unknown_layer_after_all(monkeypatch):
    stream = _Stream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: stream)
    w = LayerLoadWaiter(["e0", "e1", "e2", "e3"])
    w.wait(0)
    w.wait(2)  # events of one stream end in order: layer 2's covers layer 1's
    w.wait(1)
    w.wait(2)
    assert stream.waited == ["e0", "e2"] and not w.done
    w.wait(7)  # not one of the pool's layers (a draft model's): everything
    w.wait_all()
    assert stream.waited == ["e0", "e2", "e3"] and w.done
    with pytest.raises(ValueError, match="one event per layer"):
        LayerLoadWaiter([])


def test_attention_waits_for_its_layer_before_the_backend_stores_or_reads_kv():
    calls: list = []
    loads = SimpleNamespace(wait=lambda layer: calls.append(("wait", layer)))
    backend = SimpleNamespace(forward=lambda *a, **k: calls.append(("attend", a[3].layer_id)) or "out")
    fb = SimpleNamespace(layer_loads=loads, attn_backend=backend)
    attn = RadixAttention(2, 4, 0.5, 1, layer_id=3)
    q = torch.zeros(1, 8)
    assert attn.forward(q, q, q, fb) == "out"
    assert calls == [("wait", 3), ("attend", 3)]
    fb.layer_loads = None  # nothing loaded: nothing to wait for
    attn.forward(q, q, q, fb)
    assert calls[-1] == ("attend", 3)


def test_slots_a_load_still_writes_are_freed_only_after_the_load(monkeypatch):
    alloc = TokenToKVPoolAllocator(16, 1)
    tree = HiRadixCache(ReqToTokenPool(2, 32), alloc, mha_pool(16),
                        HiCacheConfig(host_tokens=32, write_policy=HiCacheWritePolicy.WRITE_THROUGH))
    ordered: list[int] = []
    monkeypatch.setattr(tree.host_pool, "order_after_loads", lambda: ordered.append(1))
    key = RadixKey(list(range(100, 108)))
    tree.insert(key, alloc.alloc(8))
    tree.evict(8)  # on the host only
    assert ordered == []
    assert tree.match_and_load(key).length == 8
    tree.evict(8)  # loaded, no pass has waited for the load: the stream orders after it before reuse
    assert ordered == [1]
    assert tree.match_and_load(key).length == 8
    assert tree.take_layer_loads() is None  # the CPU loads synchronously; a pass took them all the same
    tree.evict(8)
    assert ordered == [1]
    tree.check_consistency()


@pytest.mark.parametrize("mla", [False, True])
def test_the_uva_copies_move_each_layers_rows_whatever_the_slot_order(mla):
    """The uva paths' indexing on the CPU (the pool's own bytes stand in for the device's view of them): a backup is
    one scatter of token rows into the pool, a load one gather per layer over its buffers' strided view."""
    dev = MLATokenToKVPool(64, 1, torch.float32, num_layers=3, kv_lora_rank=5, qk_rope_head_dim=3) if mla \
        else mha_pool(64)
    for i, b in enumerate(dev.buffers()):
        b.copy_((torch.arange(b.shape[0], dtype=torch.float32) + 1000 * i)[:, None, None].expand_as(b))
    host = HostKVPool(128, dev)
    host._host_words = as_words(host.kv.view(torch.uint8).reshape(129, host.num_buffers, -1), 2)
    assert host.uva
    g = torch.Generator().manual_seed(1)
    src = torch.randperm(63, generator=g)[:40] + 1
    hs = torch.randperm(127, generator=g)[:40] + 1
    host.backup(src, hs)
    host.flush()
    assert (host.stats.d2h_copies, host.stats.scattered_backups) == (1, 0)
    nb = host.num_buffers
    assert torch.equal(host.read(hs)[:, :, 0, -1], expected(src, nb))
    for b in dev.buffers():
        b.fill_(-1.0)
    dst = torch.randperm(63, generator=g)[:40] + 1
    host.load(hs, dst)
    assert host.stats.h2d_copies == len(host.layer_buffers) and host.take_layer_loads() is None
    assert torch.equal(torch.stack([b[dst, 0, -1] for b in dev.buffers()], dim=1), expected(src, nb))


@cuda_only
def test_a_uva_load_is_a_kernel_per_layer_and_each_layer_is_in_place_once_waited_for():
    dev = mha_pool(device="cuda")
    host = HostKVPool(512, dev)
    assert host.uva, "the device cannot address the pinned host pool"
    g = torch.Generator().manual_seed(0)
    src = torch.randperm(255, generator=g)[:120] + 1
    hs = torch.randperm(500, generator=g)[:120] + 4  # scattered host slots: still one kernel
    host.backup(src, hs)
    host.flush()
    assert (host.stats.d2h_copies, host.stats.scattered_backups) == (1, 0)
    assert torch.equal(host.read(hs)[:, :, 1, 2], expected(src, 2 * LAYERS))
    for b in dev.buffers():
        b.fill_(-1.0)
    dst = torch.randperm(255, generator=g)[:120] + 1
    host.load(hs, dst)
    assert (host.stats.h2d_copies, host.stats.gathered_loads) == (LAYERS, 0)
    waiter = host.take_layer_loads()
    assert waiter.num_layers == LAYERS and host.take_layer_loads() is None
    bufs = dev.buffers()
    for layer in range(LAYERS):
        waiter.wait(layer)
        got = torch.stack([bufs[layer][dst.cuda(), 0, 0], bufs[LAYERS + layer][dst.cuda(), 0, 0]], dim=1).cpu()
        assert torch.equal(got, expected(src, 2 * LAYERS)[:, [layer, LAYERS + layer]])
    assert waiter.done


def test_a_rounds_loads_are_issued_as_one_copy_when_the_pass_takes_them():
    """As on CUDA (defer_loads): the loads of the requests admitted in one round are one copy (a few kernels per
    layer, not per request), issued when the pass takes them, or first when a loaded node's slots are freed."""
    alloc = TokenToKVPoolAllocator(32, 1)
    dev = mha_pool(32)
    tree = HiRadixCache(ReqToTokenPool(2, 32), alloc, dev,
                        HiCacheConfig(host_tokens=64, write_policy=HiCacheWritePolicy.WRITE_THROUGH))
    tree.defer_loads = True
    keys = [RadixKey(list(range(100 * i, 100 * i + 8))) for i in (1, 2, 3)]
    rows = {}
    for key in keys:
        slots = alloc.alloc(8)
        rows[key.token_ids[0]] = torch.stack([b[slots, 1, 2] for b in dev.buffers()], dim=1)
        tree.insert(key, slots)
    tree.evict(24)  # all three on the host only
    for b in dev.buffers():
        b.fill_(-1.0)
    got = [tree.match_and_load(k) for k in keys[:2]]
    assert [m.length for m in got] == [8, 8] and tree.host_pool.stats.loads == 0  # queued, not issued
    assert tree.take_layer_loads() is None and tree.host_pool.stats.loads == 1  # one copy for both (CPU: done)
    for key, m in zip(keys, got):
        assert torch.equal(torch.stack([b[m.device_indices, 1, 2] for b in dev.buffers()], dim=1),
                           rows[key.token_ids[0]])
    m = tree.match_and_load(keys[2])
    tree.evict(32)  # frees the pending load's slots: it is issued first (and ordered before any reuse)
    assert tree.host_pool.stats.loads == 2 and m.last_node.value is None
    tree.check_consistency()
