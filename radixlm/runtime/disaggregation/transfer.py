"""What a prefill server hands a decode server for one room, and the interface every transfer backend implements.

The decode server pulls: it allocates the request's slots, asks the prefill server's bootstrap server for the room
(`KVReceiver.fetch`), and writes what comes back into its pool. The prefill server publishes a room's KV once its
prefill is done (`KVSender.publish`), or says why there is none (`KVSender.fail`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from radixlm.runtime.args.choices import TRANSFER_BACKENDS


@dataclass(frozen=True)
class KVPayload:
    """One room's KV and the state the decode side continues from. k and v: [layers, prompt tokens, heads, head
    dim], on the host (or, on the prefill side, still on the GPU until a fetch says where they go). On failure,
    `error` says why and the rest is empty."""

    room: int
    first_token: int = -1
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    # The first token's logprob entries and the prompt's (Req's fields of the same names), when asked for.
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    output_token_ids_logprobs: list = field(default_factory=list)
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens the prefill server's radix cache held
    error: str | None = None
    # Set instead of k and v where the prefill server wrote the KV into the decode server's slots itself (the fetch's
    # `dest`, cuda_ipc.py): how many tokens it wrote, all of them before this payload was sent.
    written_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.written_tokens if self.k is None else self.k.shape[1]


class KVSender(Protocol):
    """The prefill side: the bootstrap server decode servers fetch rooms from."""

    def publish(self, payload: KVPayload, ready: object | None = None, to: bytes | None = None) -> None:
        """Makes the room's KV (or its error) available; a copy it owns, kept until fetched or timed out. to: the
        fetch taken by `take_dest` that this answers (sent once `ready`, a CUDA event, has completed)."""

    def staged_bytes(self) -> int:
        """Bytes of published KV still on the GPU, waiting for their fetch."""

    def take_dest(self, room: int) -> tuple[bytes, dict] | None:
        """A fetch of the room that came before its KV with a pool to write into (the asker and its `dest`), now the
        caller's to answer; None if there is none."""

    def pending(self) -> int:
        """Rooms published and not fetched yet (for tests and /server_info)."""

    def close(self) -> None: ...


class KVReceiver(Protocol):
    """The decode side."""

    def fetch(self, room: int, host: str, port: int, timeout_s: float, dest: dict | None = None) -> None:
        """Starts fetching a room from the bootstrap server at host:port; poll() returns it, or its error after
        timeout_s. dest: {"pool": cuda_ipc.export_pool(...), "slots": [...]}, where the prefill server may write the
        KV itself."""

    def cancel(self, room: int) -> None:
        """The room is no longer wanted (its request was aborted): what arrives for it is dropped."""

    def poll(self) -> list[KVPayload]:
        """The rooms that arrived or failed since the last call; never waits."""

    def close(self) -> None: ...


def make_sender(backend: str, port: int, timeout_s: float, peers: object | None = None) -> KVSender:
    """peers: the prefill side's cuda_ipc.PeerPools, shared with the sender's thread (one mapping per decode pool)."""
    _check(backend)
    from radixlm.runtime.disaggregation.zmq_backend import ZmqKVSender

    return ZmqKVSender(port, timeout_s, peers=peers)


def make_receiver(backend: str, device: str | torch.device = "cpu") -> KVReceiver:
    """device: the decode pool's (rooms' KV arrive there)."""
    _check(backend)
    from radixlm.runtime.disaggregation.zmq_backend import ZmqKVReceiver

    return ZmqKVReceiver(device)


def _check(backend: str) -> None:
    """Only zmq moves pages yet: the others say at start why they cannot (mooncake_backend.py)."""
    if backend not in TRANSFER_BACKENDS:
        raise ValueError(f"unknown transfer backend {backend!r}: one of {', '.join(TRANSFER_BACKENDS)}")
    if backend != "zmq":
        from radixlm.runtime.disaggregation import mooncake_backend

        (mooncake_backend.require_mooncake if backend == "mooncake" else mooncake_backend.require_nixl)()
