"""The extend kernel's work list (imports no Triton: the attention backend builds it with the pass's metadata).

A program per (query head, request, block of BLOCK_M new tokens), only for blocks that hold new tokens: a grid sized
by the pass's longest prompt for every request left most programs of a pass of many short prompts and one long one
with nothing to do (ShareGPT-like's prefill passes on an H100:
benchmarks/results/kernels/h100/session_1127b/extend_blocks.json, from a probe since retired: benchmarks/RETIRED.md).
Request by request, as the grid ran: a request's blocks next to each other share its keys in L2 (heaviest-first was
2-7% slower)."""
from __future__ import annotations


def extend_block_m(max_extend: int) -> int:
    """New tokens per program: 16 when no request of the pass extends by more (drafts, short catch-ups), else 64."""
    return 64 if max_extend > 16 else 16


def extend_blocks(extend_lens: list[int], block_m: int) -> list[int]:
    """[request, block, request, block, ...]: each request's query blocks, in order."""
    return [x for i, ext in enumerate(extend_lens) for m in range(-(-ext // block_m)) for x in (i, m)]
