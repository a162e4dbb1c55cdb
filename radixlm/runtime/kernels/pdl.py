"""Programmatic dependent launch (PDL, sm_90 and later) for the kernels of a decode step.

In a CUDA graph each kernel of a stream starts only when the one before it has finished: its programs are dispatched,
then its first loads wait a DRAM round trip, while the GPU drains the previous kernel's last wave. At batch 1 an 8B
step is 180 (bf16) to 276 (FP8) launches of 1-64 us (profiles: results/kernels/h200/decode_merge/, results/offline/
quant/fp8_fused_qkv/), so that fixed cost is a large part of it. Launched with PDL, a kernel may start once every
program of the previous one has passed its `pdl_wait`: its programs issue what does not depend on earlier kernels (a
GEMV's first weight tile), then wait in `pdl_wait` until the previous kernel has finished and its memory is visible,
and from there let the next kernel launch. Releasing the next kernel only after the wait keeps at most one kernel
waiting ahead of the running one. Released at each kernel's start instead (the first try; two device calls, pdl/r1
against pdl/r2), FP8 at one row took 2.86 ms against 2.74 and bf16 4.42 against 4.27: waiting kernels could then
release theirs in turn, and their programs hold SM slots (our reading, not profiled).

The invariant, for every kernel launched with PDL (`pdl_options`): every program calls `pdl_wait` before it reads
anything an earlier kernel of the stream wrote (activations, the KV pool, work lists) and before its first store. A
program that skipped it could read stale data, or finish before the previous kernel, and so break the order of the
ones after it. Kernels launched without PDL (torch's, cuBLAS') keep full stream order, with or without PDL around them.

RADIXLM_PDL=0 launches every kernel without it (A/B runs; read once a process)."""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4; an older one launches without PDL
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the installed Triton
    gdc_launch_dependents = gdc_wait = None

PDL_MIN_CAPABILITY = (9, 0)
# The rows of a pass (tokens) up to which kernels launch with PDL. On the H200 (Llama-3.1-8B shapes, decode steps,
# RADIXLM_PDL=0 against 1 in one lease): at one row FP8 2.84 -> 2.74 ms, W4A16 2.62 -> 2.45, bf16 4.21 -> 4.20; at
# four rows FP8 3.51 -> 3.58, and at 8 and 64 rows the norm, SiLU and attention kernels after cuBLAS' GEMMs (which
# never release their dependents early) 1-2% slower (benchmarks/results/offline/quant/pdl/).
PDL_MAX_ROWS = 1


@functools.cache
def _device_takes_pdl(index: int) -> bool:
    return (gdc_wait is not None and os.environ.get("RADIXLM_PDL", "1") != "0"
            and os.environ.get("TRITON_INTERPRET", "0") != "1"
            and torch.cuda.get_device_capability(index) >= PDL_MIN_CAPABILITY)


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: a CUDA device of sm_90 or later, compiled kernels (not Triton's
    interpreter), RADIXLM_PDL not 0."""
    if device.type != "cuda":
        return False
    return _device_takes_pdl(device.index if device.index is not None else torch.cuda.current_device())


def pdl_options(device: torch.device, rows: int) -> dict:
    """The launch keywords of a PDL kernel on `device` over `rows` rows (tokens): its PDL constexpr, and Triton's
    launch_pdl option where on (up to PDL_MAX_ROWS rows). Every launch and prebuild of the kernel passes the same, so
    that they meet one compiled kernel."""
    return {"PDL": True, "launch_pdl": True} if rows <= PDL_MAX_ROWS and pdl_enabled(device) else {"PDL": False}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Before a PDL kernel's program reads what earlier kernels wrote, or stores: waits until the previous kernel has
    finished and its writes are visible (the module's invariant), then lets the next kernel launch once every program
    has passed here."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
