"""The zmq transfer backend between two endpoints of one process over TCP: a room fetched before or after it is
published, dtypes byte for byte, errors, deadlines and expiry."""
from __future__ import annotations

import time

import pytest
import torch

from radixlm.runtime.disaggregation.transfer import KVPayload, make_receiver, make_sender
from radixlm.runtime.disaggregation.zmq_backend import decode, encode
from tests.runtime.server.conftest import free_port


def _wait(receiver, n: int = 1, timeout: float = 5.0) -> list[KVPayload]:
    got: list[KVPayload] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += receiver.poll()
        time.sleep(0.005)
    return got


@pytest.fixture
def pair():
    port = free_port()
    sender, receiver = make_sender("zmq", port, timeout_s=0.5), make_receiver("zmq")
    yield sender, receiver, port
    sender.close()
    receiver.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_encode_decode_byte_for_byte(dtype):
    k = torch.randn(2, 7, 3, 4).to(dtype)
    v = torch.randn(2, 7, 3, 4).to(dtype)
    p = decode(encode(KVPayload(5, first_token=9, k=k, v=v, output_token_logprobs=[(-1.5, 9)], cached_tokens=3)))
    assert (p.room, p.first_token, p.cached_tokens, p.output_token_logprobs) == (5, 9, 3, [(-1.5, 9)])
    assert p.k.dtype == dtype and torch.equal(p.k.view(torch.uint8), k.view(torch.uint8))
    assert torch.equal(p.v.view(torch.uint8), v.view(torch.uint8))
    assert decode(encode(KVPayload(6, error="boom"))).error == "boom"


def test_rooms_arrive_whether_fetched_before_or_after_publishing(pair):
    sender, receiver, port = pair
    k, v = torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8)
    receiver.fetch(1, "127.0.0.1", port, 5.0)  # asked before it exists: answered when published
    time.sleep(0.05)
    sender.publish(KVPayload(1, first_token=3, k=k, v=v))
    sender.publish(KVPayload(2, first_token=4, k=v, v=k))
    sender.publish(KVPayload(3, error="prefill failed: grammar"))
    receiver.fetch(2, "127.0.0.1", port, 5.0)
    receiver.fetch(3, "127.0.0.1", port, 5.0)
    got = {p.room: p for p in _wait(receiver, 3)}
    assert torch.equal(got[1].k, k) and torch.equal(got[1].v, v) and got[1].first_token == 3
    assert torch.equal(got[2].k, v) and got[2].first_token == 4
    assert got[3].error == "prefill failed: grammar"


def test_deadlines_cancel_and_expiry(pair):
    sender, receiver, port = pair
    receiver.fetch(10, "127.0.0.1", free_port(), 0.2)  # nobody listens there
    receiver.fetch(11, "127.0.0.1", port, 0.2)  # never published
    receiver.fetch(12, "127.0.0.1", port, 5.0)
    receiver.cancel(12)
    sender.publish(KVPayload(12, first_token=1, k=torch.zeros(1, 1, 1, 1), v=torch.zeros(1, 1, 1, 1)))
    got = _wait(receiver, 2, timeout=2.0)
    assert sorted(p.room for p in got) == [10, 11]
    assert all("within 0.2 s" in p.error for p in got)
    assert _wait(receiver, 1, timeout=0.3) == []  # the cancelled room is dropped
    sender.publish(KVPayload(13, first_token=1, k=torch.zeros(1, 1, 1, 1), v=torch.zeros(1, 1, 1, 1)))
    time.sleep(0.1)
    assert sender.pending() >= 1
    deadline = time.monotonic() + 3
    while sender.pending() and time.monotonic() < deadline:  # unclaimed: dropped after the sender's 0.5 s
        time.sleep(0.05)
    assert sender.pending() == 0


def test_unknown_backend_and_busy_port():
    with pytest.raises(ValueError, match="unknown transfer backend"):
        make_receiver("carrier-pigeon")
    with pytest.raises(RuntimeError, match="mooncake"):
        make_receiver("mooncake")
    with pytest.raises(RuntimeError, match="nixl"):
        make_sender("nixl", free_port(), 1.0)
    port = free_port()
    first = make_sender("zmq", port, 1.0)
    try:
        with pytest.raises(RuntimeError, match="cannot listen on port"):
            make_sender("zmq", port, 1.0)
    finally:
        first.close()


def test_the_wire_carries_json_and_refuses_anything_else():
    """Nothing read from the bootstrap port is unpickled: a payload round-trips through JSON (logprob entries come
    back as tuples), and a header or fetch of another shape is a ValueError, not code run."""
    import pickle

    import torch

    from radixlm.runtime.disaggregation.transfer import KVPayload
    from radixlm.runtime.disaggregation.zmq_backend import decode, encode, parse_fetch

    k = torch.arange(24, dtype=torch.float32).reshape(2, 3, 2, 2)
    payload = KVPayload(7, first_token=5, k=k, v=-k, output_token_logprobs=[(-0.5, 5)],
                        output_top_logprobs=[[(-0.5, 5), (-1.5, 9)]], input_top_logprobs=[[]])
    back = decode(encode(payload))
    assert torch.equal(back.k, k) and torch.equal(back.v, -k) and back.first_token == 5
    assert back.output_token_logprobs == [(-0.5, 5)] and back.output_top_logprobs == [[(-0.5, 5), (-1.5, 9)]]
    assert back.input_top_logprobs == [[]]
    with pytest.raises(ValueError):
        decode([pickle.dumps({"room": 1})])
    with pytest.raises(ValueError):
        decode([b'{"room": 1, "dtype": "Tensor", "shape": [1]}', b"", b""])
    with pytest.raises(ValueError):
        parse_fetch(b'{"room": "1"}')
    for bad in ('{"room": 1, "dest": 3}', '{"room": 1, "dest": {"pool": {}, "slots": [1, "2"]}}',
                '{"room": 1, "dest": {"slots": [1]}}'):
        with pytest.raises(ValueError):
            parse_fetch(bad.encode())
    assert parse_fetch(b'{"room": 12}') == (12, None)
    assert parse_fetch(b'{"room": 3, "dest": {"pool": {"host": "h"}, "slots": [4, 5]}}') == (
        3, {"pool": {"host": "h"}, "slots": [4, 5]})
    written = decode(encode(KVPayload(9, first_token=2, written_tokens=6)))
    assert written.k is None and written.num_tokens == 6


class _Peers:
    def __init__(self, buffers):
        self.buffers = buffers

    def open(self, export):
        return self.buffers if export.get("host") == "here" else None


def test_a_fetch_with_a_pool_gets_the_kv_written_there(pair):
    """A room published before its fetch goes into the pool the fetch names (the answer carries no KV) where the
    sender can open it, and as bytes where it cannot; taken fetches are answered by the publish that names them."""
    sender, receiver, port = pair
    pool = [torch.zeros(16, 2, 8) for _ in range(4)]  # two layers' k then v
    sender.peers = _Peers(pool)
    k, v = torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8)
    slots = [9, 3, 4, 12, 0]
    sender.publish(KVPayload(20, first_token=3, k=k, v=v))
    sender.publish(KVPayload(21, first_token=3, k=k, v=v))
    time.sleep(0.05)
    receiver.fetch(20, "127.0.0.1", port, 5.0, {"pool": {"host": "here"}, "slots": slots})
    receiver.fetch(21, "127.0.0.1", port, 5.0, {"pool": {"host": "elsewhere"}, "slots": slots})
    got = {p.room: p for p in _wait(receiver, 2)}
    assert got[20].k is None and got[20].written_tokens == 5 and got[20].first_token == 3
    for layer in range(2):
        assert torch.equal(pool[layer][slots], k[layer]) and torch.equal(pool[2 + layer][slots], v[layer])
    assert torch.equal(got[21].k, k)
    receiver.fetch(22, "127.0.0.1", port, 5.0, {"pool": {"host": "here"}, "slots": [1]})
    deadline = time.monotonic() + 5
    while (taken := sender.take_dest(22)) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert taken is not None and taken[1]["slots"] == [1]
    sender.publish(KVPayload(22, first_token=7, written_tokens=1), to=taken[0])
    (answer,) = _wait(receiver)
    assert answer.room == 22 and answer.written_tokens == 1 and answer.k is None
    assert sender.staged_bytes() == 0
