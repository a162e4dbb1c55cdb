"""The scheduler parts' slices of ServerArgs, frozen: each part is built from its own."""
from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.args import ServerArgs, Toggle

# Without --chunked-prefill-size: prompts are cut into chunks of this many tokens (CUDA / CPU).
CUDA_CHUNKED_PREFILL_SIZE = 8192
CPU_CHUNKED_PREFILL_SIZE = 2048


@dataclass(frozen=True)
class AdmissionConfig:
    page_size: int
    max_prefill_tokens: int
    chunked_prefill_size: int | None  # None: prompts are not cut into chunks
    max_running_requests: int
    schedule_conservativeness: float
    mixed_chunk: Toggle  # on: every prefill carries the decode rows; auto: only a whole one that fits a graph

    @classmethod
    def from_args(cls, args: ServerArgs, device: str, max_running_requests: int) -> "AdmissionConfig":
        chunk = args.chunked_prefill_size
        if chunk is None:
            chunk = CUDA_CHUNKED_PREFILL_SIZE if device.startswith("cuda") else CPU_CHUNKED_PREFILL_SIZE
        # A pooled output reads the whole prompt's last hidden states in one pass: embedding prompts are not cut.
        whole = chunk == -1 or args.is_embedding
        return cls(args.page_size, args.max_prefill_tokens, None if whole else chunk, max_running_requests,
                   args.schedule_conservativeness, args.mixed_chunk)


@dataclass(frozen=True)
class OutputConfig:
    stream_interval: int  # a streaming request's tokens go out every this many (its own stream_interval first)

    @classmethod
    def from_args(cls, args: ServerArgs) -> "OutputConfig":
        return cls(args.stream_interval)
