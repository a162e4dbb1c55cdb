"""The zmq transfer backend: rooms' KV over TCP, one ROUTER socket on the prefill server (its bootstrap server) and
a DEALER per prefill server on the decode server, each run by a thread of its own, so the scheduler never waits on
the network.

Wire format: decode -> prefill [b"", json({"room": r})]; prefill -> decode [b"", json(header), k bytes, v bytes],
the header being the payload's fields but k and v, plus their dtype (one of WIRE_DTYPES) and shape. JSON, not pickle:
the bootstrap port listens on every interface, and nothing read from it may run code."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import json
import queue
import threading
import time
import uuid
import warnings

import torch
import zmq

from radixlm.runtime.disaggregation.cuda_ipc import PeerPools, check_layout, write_rows
from radixlm.runtime.disaggregation.transfer import KVPayload

logger = logging.getLogger(__name__)

POLL_MS = 20  # the threads' wake-up period when nothing arrives (expiries and deadlines are checked this often)
# KV the decode side's thread moves to the device ahead of the scheduler; past this, rooms wait on the host (their
# copy then runs on the scheduler's thread), so a burst of arrivals cannot take the memory the model runs in.
DEVICE_INBOX_BYTES = 2 << 30


WIRE_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16,
                                                          torch.float8_e4m3fn, torch.float8_e5m2)}
_FIELDS = {f.name for f in dataclasses.fields(KVPayload)} - {"k", "v"}


def _tuples(x):
    """JSON's lists back to the payload's shapes: a non-empty list of scalars (a logprob entry) was a tuple."""
    if isinstance(x, list):
        items = [_tuples(i) for i in x]
        return tuple(items) if items and not any(isinstance(i, (list, tuple)) for i in items) else items
    return x


def encode(payload: KVPayload) -> list:
    header = {f: getattr(payload, f) for f in _FIELDS}
    frames: list = []
    if payload.k is not None:
        header["dtype"], header["shape"] = str(payload.k.dtype).removeprefix("torch."), tuple(payload.k.shape)
        frames = [t.contiguous().view(torch.uint8).numpy() for t in (payload.k, payload.v)]
    return [json.dumps(header).encode(), *frames]


def decode(frames: list) -> KVPayload:
    """frames: bytes or zmq Frames (the tensors then share the frames' memory)."""
    header = json.loads(bytes(memoryview(frames[0])))
    if not isinstance(header, dict) or not set(header) <= _FIELDS | {"dtype", "shape"} or "room" not in header:
        raise ValueError("a KV payload's header must be an object of the payload's fields")
    dtype, shape = header.pop("dtype", None), header.pop("shape", None)
    header = {k: _tuples(v) for k, v in header.items()}
    if dtype is not None:
        if len(frames) != 3:
            raise ValueError(f"room {header.get('room')}: expected k and v frames, got {len(frames) - 1}")
        if dtype not in WIRE_DTYPES:
            raise ValueError(f"room {header.get('room')}: unknown KV dtype {dtype!r}")
        dt = WIRE_DTYPES[dtype]
        with warnings.catch_warnings():  # the frames' own memory, read-only: the KV is only read from here on
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            k, v = (torch.frombuffer(memoryview(f), dtype=torch.uint8).view(dt).reshape(shape) for f in frames[1:])
        header["k"], header["v"] = k, v
    return KVPayload(**header)


def parse_fetch(body: bytes) -> tuple[int, dict | None]:
    """The room a fetch asks for and where the KV may be written (its `dest`, or None); a ValueError for anything
    else."""
    msg = json.loads(body)
    room = msg.get("room") if isinstance(msg, dict) else None
    if not isinstance(room, int) or isinstance(room, bool):
        raise ValueError("a fetch must be {\"room\": <integer>}")
    dest = msg.get("dest")
    if dest is not None and not (isinstance(dest, dict) and isinstance(dest.get("pool"), dict)
                                 and isinstance(dest.get("slots"), list)
                                 and all(isinstance(s, int) and not isinstance(s, bool) for s in dest["slots"])):
        raise ValueError("a fetch's dest must be {\"pool\": {...}, \"slots\": [<integer>, ...]}")
    return room, dest


def _nbytes(payload: KVPayload) -> int:
    return payload.k.nbytes + payload.v.nbytes


class _Worker:
    """A thread that owns its zmq sockets; other threads hand it work through a queue and a wake-up socket."""

    def __init__(self, name: str) -> None:
        self.ctx = zmq.Context()
        # Every socket drops what it could not send when closed: else a socket left with a queued message (say a
        # wake-up after the thread ended) makes the context's term() -- run by whichever thread collects it --
        # wait forever.
        self.ctx.setsockopt(zmq.LINGER, 0)
        self._inbox: queue.Queue = queue.Queue()
        self._wake_addr = f"inproc://{name}-{uuid.uuid4().hex}"
        self._wake_recv = self.ctx.socket(zmq.PULL)
        self._wake_recv.bind(self._wake_addr)
        self._wake_send = self.ctx.socket(zmq.PUSH)  # used by the owner's thread only
        self._wake_send.connect(self._wake_addr)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def submit(self, item) -> None:
        self._inbox.put(item)
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            try:
                self._wake_send.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:  # the thread polls every POLL_MS anyway (or has ended)
                pass

    def close(self) -> None:
        self._stop.set()
        self._wake()
        self.thread.join(timeout=2)
        self._wake_send.close(linger=0)
        if not self.thread.is_alive():  # else its sockets are still open: the context goes with the process
            self.ctx.term()

    def _poller(self) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self._wake_recv, zmq.POLLIN)
        return poller

    def _poll(self, poller: zmq.Poller) -> dict:
        """Waits up to POLL_MS for a socket or a wake-up; the wake-ups are consumed (the inbox says what came)."""
        events = dict(poller.poll(POLL_MS))
        if self._wake_recv in events:
            while self._wake_recv.poll(0):
                self._wake_recv.recv()
        return events

    def _drain(self) -> list:
        items = []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    def _run(self) -> None:
        raise NotImplementedError


class ZmqKVSender(_Worker):
    """The prefill server's bootstrap server: serves each room once, to the first decode server that asks."""

    def __init__(self, port: int, timeout_s: float, host: str = "*", peers: PeerPools | None = None) -> None:
        super().__init__("kv-sender")
        self.timeout_s = timeout_s
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a decode server that went away: the reply is dropped
        try:
            self.sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as e:
            for sock in (self.sock, self._wake_recv, self._wake_send):
                sock.close(linger=0)
            self.ctx.term()
            raise RuntimeError(f"bootstrap server: cannot listen on port {port} ({e}); set "
                               "--disaggregation-bootstrap-port") from None
        # room -> (its payload, the CUDA event its GPU-resident KV is ready at or None, expiry)
        self.ready: dict[int, tuple[KVPayload, object | None, float]] = {}
        self.waiting: dict[int, tuple[bytes, float]] = {}  # room -> (the asking decode server's identity, expiry)
        # Fetches that came before their room with a pool to write into, for the scheduler's thread (take_dest):
        # room -> (identity, dest). A room taken from here is answered by its publish(..., to=identity).
        self._dests: dict[int, tuple[bytes, dict]] = {}
        self._dest_lock = threading.Lock()
        self._staged = 0  # bytes of KV held on the GPU in `ready` (and in the inbox), under _dest_lock
        self.peers = peers if peers is not None else PeerPools()
        self.written = 0  # rooms written into a decode server's pool by this thread (staged ones)
        self._stream: torch.cuda.Stream | None = None  # this thread's copies of staged KV (made at the first)
        self._pending = 0
        self.thread.start()

    def publish(self, payload: KVPayload, ready: object | None = None, to: bytes | None = None) -> None:
        if payload.k is not None and payload.k.is_cuda:
            with self._dest_lock:
                self._staged += _nbytes(payload)
        self.submit((payload, ready, to))

    def staged_bytes(self) -> int:
        return self._staged

    def take_dest(self, room: int) -> tuple[bytes, dict] | None:
        with self._dest_lock:
            return self._dests.pop(room, None)

    def pending(self) -> int:
        return self._pending

    def _run(self) -> None:
        poller = self._poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            events = self._poll(poller)
            now = time.monotonic()
            for payload, ready, to in self._drain():
                if to is not None:  # the answer to a fetch the scheduler took (take_dest)
                    self.waiting.pop(payload.room, None)
                    self._answer(to, payload, ready, None)
                    continue
                with self._dest_lock:
                    dest = self._dests.pop(payload.room, None)
                asker = self.waiting.pop(payload.room, None)
                if asker is not None:
                    self._answer(asker[0], payload, ready, None if dest is None else dest[1])
                else:
                    self.ready[payload.room] = (payload, ready, now + self.timeout_s)
            while self.sock in events and self.sock.poll(0):
                frames = self.sock.recv_multipart()
                try:
                    if len(frames) != 3:
                        raise ValueError(f"{len(frames)} frames")
                    identity, body = frames[0], frames[2]
                    room, dest = parse_fetch(body)
                except ValueError:
                    logger.warning("a bootstrap fetch that is not a room's was dropped")
                    continue
                entry = self.ready.pop(room, None)
                if entry is not None:
                    self._answer(identity, entry[0], entry[1], dest)
                else:
                    self.waiting[room] = (identity, now + self.timeout_s)
                    if dest is not None:
                        with self._dest_lock:
                            self._dests[room] = (identity, dest)
            self._expire(now)
            self._pending = len(self.ready)
        self.sock.close(linger=0)
        self._wake_recv.close(linger=0)

    def _answer(self, identity: bytes, payload: KVPayload, ready, dest: dict | None) -> None:
        """Sends the room to the asker: KV still on the GPU goes into dest's pool where this process can open it
        (the answer then carries no KV), else to the host first."""
        if ready is not None:
            ready.synchronize()
        if payload.k is not None:
            if payload.k.is_cuda:
                with self._dest_lock:
                    self._staged -= _nbytes(payload)
            written = None
            if payload.k.is_cuda and self._stream is None:
                self._stream = torch.cuda.Stream(payload.k.device)
            # Not the legacy default stream, which the scheduler's passes run on: these copies would queue behind them.
            with torch.cuda.stream(self._stream) if payload.k.is_cuda else contextlib.nullcontext():
                try:
                    written = self._write(payload, dest) if dest is not None else None
                except Exception as e:  # noqa: BLE001 - the host path still serves the room
                    logger.warning("room %d: writing into the decode server's pool failed (%s: %s); sent from the "
                                   "host", payload.room, type(e).__name__, e)
                if written is not None:
                    payload = written
                elif payload.k.is_cuda:
                    payload = dataclasses.replace(payload, k=payload.k.cpu(), v=payload.v.cpu())
        self._send(identity, encode(payload))

    def _write(self, payload: KVPayload, dest: dict) -> KVPayload | None:
        """The answer once payload's KV is in dest's slots (or why it cannot be); None: dest is out of reach."""
        peer = self.peers.open(dest["pool"])
        if peer is None:
            return None
        rows = [*payload.k, *payload.v]
        problem = check_layout(rows, peer)
        if problem is None and len(dest["slots"]) != payload.num_tokens:
            problem = f"{len(dest['slots'])} slots for a {payload.num_tokens}-token prompt"
        if problem is not None:
            return KVPayload(payload.room, error=problem)
        writer = write_rows(rows, peer, torch.tensor(dest["slots"]))
        if writer.type == "cuda":  # the writes, and with them the reads of this pool's staged copy
            torch.cuda.current_stream(writer).synchronize()
        self.written += 1
        return dataclasses.replace(payload, k=None, v=None, written_tokens=payload.num_tokens)

    def _send(self, identity: bytes, frames: list) -> None:
        try:
            self.sock.send_multipart([identity, b"", *frames], copy=False)
        except zmq.ZMQError as e:
            logger.warning("bootstrap server: could not send a room's KV (%s)", e)

    def _expire(self, now: float) -> None:
        for room in [r for r, (_, _, t) in self.ready.items() if t < now]:
            payload = self.ready.pop(room)[0]
            if payload.k is not None and payload.k.is_cuda:
                with self._dest_lock:
                    self._staged -= _nbytes(payload)
            logger.warning("room %d: no decode server fetched its KV within %g s; dropped", room, self.timeout_s)
        for room in [r for r, (_, t) in self.waiting.items() if t < now]:
            identity, _ = self.waiting.pop(room)
            with self._dest_lock:
                self._dests.pop(room, None)
            self._send(identity, encode(KVPayload(room, error=f"the prefill server has no KV for room {room} "
                                                              f"after {self.timeout_s:g} s")))


class ZmqKVReceiver(_Worker):
    """The decode server's side: a DEALER per prefill bootstrap server, rooms matched by the reply's header."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        """device: the decode pool's; on CUDA a room's KV is copied there by this thread, on a stream of its own, so
        the scheduler's thread only scatters it on the device."""
        super().__init__("kv-receiver")
        self.device = torch.device(device)
        self.done: queue.Queue = queue.Queue()
        self.socks: dict[str, zmq.Socket] = {}
        self.pending: dict[int, tuple[str, float, float]] = {}  # room -> (address, deadline, timeout)
        self._stream = None
        self._on_device = 0  # bytes of KV this thread moved to the device and the scheduler has not polled yet
        self.thread.start()

    def fetch(self, room: int, host: str, port: int, timeout_s: float, dest: dict | None = None) -> None:
        self.submit(("fetch", room, host, port, timeout_s, dest))

    def cancel(self, room: int) -> None:
        self.submit(("cancel", room))

    def poll(self) -> list[KVPayload]:
        out = []
        while True:
            try:
                payload = self.done.get_nowait()
            except queue.Empty:
                return out
            if payload.k is not None and payload.k.is_cuda:
                with self._lock:
                    self._on_device -= _nbytes(payload)
            out.append(payload)

    def _to_device(self, payload: KVPayload) -> KVPayload:
        if payload.k is None or self.device.type != "cuda" or self._on_device >= DEVICE_INBOX_BYTES:
            return payload
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)  # not the legacy default stream: no wait on the model's
        with torch.cuda.stream(self._stream):
            k, v = payload.k.to(self.device), payload.v.to(self.device)
        self._stream.synchronize()
        with self._lock:
            self._on_device += _nbytes(payload)
        return dataclasses.replace(payload, k=k, v=v)

    def _sock(self, addr: str, poller: zmq.Poller) -> zmq.Socket:
        sock = self.socks.get(addr)
        if sock is None:
            sock = self.socks[addr] = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{addr}")
            poller.register(sock, zmq.POLLIN)
        return sock

    def _run(self) -> None:
        poller = self._poller()
        while not self._stop.is_set():
            events = self._poll(poller)
            now = time.monotonic()
            for item in self._drain():
                if item[0] == "fetch":
                    _, room, host, port, timeout_s, dest = item
                    addr = f"{host}:{port}"
                    self.pending[room] = (addr, now + timeout_s, timeout_s)
                    msg = {"room": room} if dest is None else {"room": room, "dest": dest}
                    self._sock(addr, poller).send_multipart([b"", json.dumps(msg).encode()])
                else:
                    self.pending.pop(item[1], None)
            for sock in [s for s in self.socks.values() if s in events]:
                while sock.poll(0):
                    frames = sock.recv_multipart(copy=False)[1:]
                    try:
                        payload = decode(frames)
                    except Exception as e:  # noqa: BLE001 - a malformed reply fails nothing but itself
                        logger.warning("a malformed KV reply was dropped: %r", e)
                        continue
                    if self.pending.pop(payload.room, None) is not None:
                        self.done.put(self._to_device(payload))
            for room in [r for r, (_, t, _) in self.pending.items() if t < now]:
                addr, _, timeout_s = self.pending.pop(room)
                self.done.put(KVPayload(room, error=f"no KV for room {room} from the prefill server's bootstrap "
                                                    f"server {addr} within {timeout_s:g} s (is it alive?)"))
        for sock in self.socks.values():
            sock.close(linger=0)
        self._wake_recv.close(linger=0)
