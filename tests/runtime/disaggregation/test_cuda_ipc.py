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
