"""Warming the L2 with a one-row pass's next weight while the bus is idle (sm_90 and later, with PDL).

At one row a decode step streams every weight once, and between two GEMVs the memory bus idles: decode attention
over a short context reads a few kilobytes a layer for ~6 us. A GEMV of a few megabytes also runs well under its
bytes floor at one row (o_proj of Llama-3.1-8B in FP8: 7.7 us against 3.5; bf16's 11.1 against 7.0, H200,
results/kernels/h200/quant_gemv_sweep_h200.log): its programs ramp up, its first loads wait a DRAM round trip, its
last wave drains. `prefetch_l2` launches a small kernel before attention that asks the L2 for (up to
L2_PREFETCH_MAX_BYTES of) the weight the layer reads after it, one `prefetch.global.L2` a 128-byte line: the lines
arrive while attention runs, and the GEMV then reads them from the L2.

The kernel waits for the previous kernel (pdl_wait, the PDL invariant) and stores nothing; prefetches are hints, so
it changes no value. RADIXLM_L2_PREFETCH=0 turns it off (A/B runs; read once a process)."""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from radixlm.runtime.kernels.pdl import PDL_MAX_ROWS, pdl_enabled, pdl_options, pdl_wait

LINE_BYTES = 128
# Half the H200's 50 MB L2: what attention and the GEMV's own reads leave room for.
L2_PREFETCH_MAX_BYTES = 24 << 20
PREFETCH_BLOCK = 512  # lines a program asks for per iteration (4 a thread at 4 warps)


@functools.cache
def _prefetch_on() -> bool:
    return os.environ.get("RADIXLM_L2_PREFETCH", "1") != "0"


@functools.cache
def _programs(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def prefetch_wanted(t: torch.Tensor, rows: int) -> bool:
    """Whether prefetch_l2 launches for a pass of `rows` rows over `t`: a contiguous CUDA tensor, PDL on its device
    (sm_90+), at most PDL_MAX_ROWS rows, RADIXLM_L2_PREFETCH not 0."""
    return (t.is_cuda and t.is_contiguous() and rows <= PDL_MAX_ROWS and _prefetch_on()
            and pdl_enabled(t.device))


@triton.jit
def _l2_prefetch_kernel(W, n_lines, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    offs = tl.arange(0, BLOCK)
    for start in range(pid * BLOCK, n_lines, step):
        line = tl.minimum(start + offs, n_lines - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l", [W + line.to(tl.int64) * 128],
                                  dtype=tl.int32, is_pure=False, pack=1)


def prefetch_l2(t: torch.Tensor, rows: int) -> None:
    """Asks the L2 for the first L2_PREFETCH_MAX_BYTES of contiguous `t` where prefetch_wanted; else nothing."""
    if not prefetch_wanted(t, rows):
        return
    n_lines = min(t.numel() * t.element_size(), L2_PREFETCH_MAX_BYTES) // LINE_BYTES
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    grid = (min(_programs(index), triton.cdiv(n_lines, PREFETCH_BLOCK)),)
    _l2_prefetch_kernel[grid](t.view(-1).view(torch.uint8), n_lines, BLOCK=PREFETCH_BLOCK, num_warps=4,
                              **pdl_options(t.device, rows))
