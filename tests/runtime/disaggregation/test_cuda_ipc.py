"""The same-host transfer's parts that run anywhere: the export's JSON, the layout check and the row copy."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.disaggregation.cuda_ipc import PeerPools, _decode, _encode, check_layout, copy_slots, export_pool


def test_export_fields_round_trip_and_refuse_the_unknown():
    args = (torch.Tensor, torch.Size([4, 2]), (2, 1), 0, torch.TypedStorage, torch.bfloat16, 1, b"\x00\xffh", 64, 0,
            False, b"ref", 3, None, True)
    assert _decode(_encode(args)) == tuple(a if not isinstance(a, torch.Size) else tuple(a) for a in args)
    for bad in ({"cls": "Popen"}, {"dtype": "object"}, {"exec": "x"}, [1]):
        with pytest.raises((KeyError, ValueError)):
            _decode(bad)
    with pytest.raises(TypeError):
        _encode(object())


def test_cpu_pools_are_not_shared_and_foreign_exports_not_opened():
    assert export_pool([torch.zeros(4, 2)]) is None
    peers = PeerPools()
    assert peers.open({"host": "another-host", "pid": 1, "uuid": "u", "device": 0,
                       "buffers": [{"seq": [None] * 7 + [{"b": "AA=="}]}]}) is None
    assert peers.open({"buffers": []}) is None


def test_a_new_decode_process_on_a_gpu_replaces_the_old_ones_pool(monkeypatch):
    """One opened pool per GPU: the same export is opened once; another process's export on that GPU replaces it."""
    peers = PeerPools()
    opened = []
    monkeypatch.setattr(peers, "_rebuild", lambda export: opened.append(export["pid"]) or [export["pid"]])
    export = lambda pid, handle: {"pid": pid, "uuid": "gpu-1", "buffers": [{"seq": [None] * 7 + [{"b": handle}]}]}  # noqa: E731
    assert peers.open(export(10, "AA==")) == [10] and peers.open(export(10, "AA==")) == [10]
    assert peers.open(export(11, "AA==")) == [11] and opened == [10, 11]
    assert list(peers._open) == ["gpu-1"]


def test_copy_slots_moves_rows_of_every_buffer():
    src = [torch.arange(20.0).reshape(10, 2) + 100 * i for i in range(3)]
    dst = [torch.zeros(8, 2) for _ in range(3)]
    assert check_layout(src, dst) is None
    assert copy_slots(src, torch.tensor([7, 2, 5]), dst, torch.tensor([0, 6, 3])) is None
    for s, d in zip(src, dst):
        assert torch.equal(d[[0, 6, 3]], s[[7, 2, 5]]) and not d[[1, 2, 4, 5, 7]].any()
    assert "same model" in check_layout(src, [torch.zeros(8, 3)] * 3)
    assert "KV buffers" in check_layout(src, dst[:2])


def _decode_process(conn) -> None:
    """A decode server's part: a stacked pool on cuda:1 exported over IPC; after the parent wrote, its rows back."""
    pool = torch.zeros(4, 64, 8, dtype=torch.bfloat16, device="cuda:1")
    bufs = list(pool.unbind(0))  # views of one allocation, as KVPool.stacked's are
    conn.send(export_pool(bufs))
    conn.recv()
    torch.cuda.synchronize(1)
    conn.send(pool.cpu())
    conn.recv()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_kernel_on_the_prefill_gpu_writes_into_another_process_pool_on_a_peer_gpu():
    """The PD path across processes: the pool opened in the writer's context, then one kernel on cuda:0 stores into
    it (opened in the owner GPU's context, the same store was an illegal address on 2 x H200)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_decode_process, args=(child,), daemon=True)
    proc.start()
    try:
        assert parent.poll(120), "the decode process did not export its pool"
        export = parent.recv()
        peer = PeerPools(torch.device("cuda:0")).open(export)
        assert peer is not None and len(peer) == 4
        src = [torch.randn(16, 8, device="cuda:0").to(torch.bfloat16) for _ in range(4)]
        event = copy_slots(src, torch.tensor([3, 0, 9]), peer, torch.tensor([5, 60, 1]))
        event.synchronize()
        parent.send("written")
        assert parent.poll(60)
        pool = parent.recv()
        for s, d in zip(src, pool):
            assert torch.equal(d[[5, 60, 1]], s[[3, 0, 9]].cpu())
            assert not d[[i for i in range(64) if i not in (5, 60, 1)]].any()
        parent.send("done")
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
