"""The one GEMM entry point of the model's linear layers and the lm_head: oneDNN-prepacked weights on CPU; on CUDA,
for the few-row GEMMs of small decode batches, whichever of the Triton kernels and cuBLAS is fastest for that weight,
measured once per layer kind (the layers of one kind share a memo: ModelRunner) and choice key, in the warm-up runs
before CUDA-graph capture. The Triton kernels: the skinny one (skinny_gemm.py) up to SKINNY_MAX_M rows and the
tensor-core one (skinny_mma.py) from MMA_MIN_M to MMA_MAX_M rows. The key is the row count up to SKINNY_MAX_M,
past it the tensor-core kernel's padded row count (skinny_mma.block_rows), which alone shapes its work.
A GEMM may take its input's element-wise step as a Prologue: the skinny kernel fuses it, other paths run it first.
The qkv GEMM may take the rotary embedding and KV store after it as an epilogue (epilogue.py): the skinny kernel
applies it at one row and marks it applied; otherwise the caller's attention does that step."""
from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable
from enum import IntEnum

import torch
import torch.nn.functional as F

from radixlm.runtime.kernels.gemm import batch_invariant, cpu_gemm
from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
from radixlm.runtime.kernels.gemm.prologue import Prologue, apply

MEASURE_REPS = 10
# A Triton kernel is taken unless cuBLAS wins by 3%. In CUDA-graph replays the skinny kernel beat cuBLAS on every
# batch-1 shape of an 8B model by 5-19% (benchmarks/results/kernels/h100/gemv_sweep.json), yet this eager
# measurement's noise gave cuBLAS 22 of the 129 GEMMs of one start-up
# (benchmarks/results/kernels/h100/profile_gpu_step_b1_b8_after.json; still 1-6 in fusions_ab/ beside it).
SKINNY_MARGIN = 1.03


def _time_us(fns: list, evict: Callable[[], object], reps: int = MEASURE_REPS) -> list[float]:
    """Median device time of one call of each fn, as a CUDA-graph replay in a model's forward pays it: each fn is
    captured in a graph of its own and each replay follows evict() (a pass over a buffer larger than the L2 cache),
    which evicts the weight as the other layers would. Called eagerly instead, the host's launch cost, larger for a
    Triton kernel than for cuBLAS, showed through whenever it outran evict(): on an H100 the skinny qkv GEMM at one row
    measured 28-145 us against 20 us in graph replays, and start-ups picked cuBLAS for up to 64 of the 8B model's 129
    batch-1 GEMMs (benchmarks/results/kernels/h100/gemm_choice_probe*.json). A replay's launch is short enough for the
    host to stay ahead. The candidates alternate, so that a drift of the device's clocks moves both alike."""
    side = _capture_stream(torch.cuda.current_device())
    side.wait_stream(torch.cuda.current_stream())
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    with torch.cuda.stream(side):
        for fn in fns:
            fn()  # compiles, and allocates what a first call on this stream allocates (cuBLAS's workspace), uncaptured
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=pool)
            fn()
            graph.capture_end()
            graphs.append(graph)
    torch.cuda.current_stream().wait_stream(side)
    for graph in graphs:
        graph.replay()
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
              for _ in range(reps)]
    for rep in events:
        for graph, (start, end) in zip(graphs, rep):
            evict()
            start.record()
            graph.replay()
            end.record()
    events[-1][-1][1].synchronize()
    return [statistics.median(rep[i][0].elapsed_time(rep[i][1]) for rep in events) * 1e3 for i in range(len(fns))]


@functools.cache
def _capture_stream(device: int) -> torch.cuda.Stream:
    """The side stream of _time_us's captures, one per device: torch keeps a cuBLAS workspace, for the process's life,
    for each stream that runs a GEMM (a new stream per measurement would hold up to 32 of them)."""
    return torch.cuda.Stream(device)


class GemmKernel(IntEnum):
    """The kernel a layer's choice memo names for a few-row GEMM."""

    CUBLAS = 0
    SKINNY = 1  # skinny_gemm.py
    SKINNY_MMA = 2  # skinny_mma.py
    CUBLASLT = 3  # a tuned cuBLASLt configuration (cublaslt.py): the memo holds its LtGemm


def kernel_of(choice) -> GemmKernel:
    """The kernel a memo entry names (an LtGemm entry is a tuned cuBLASLt configuration)."""
    return choice if isinstance(choice, GemmKernel) else GemmKernel.CUBLASLT


def _fastest(kernels: dict[GemmKernel, Callable[..., torch.Tensor]], x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None, prologue: Prologue | None, epilogue: RotaryStore | None) -> GemmKernel:
    """The fastest of the Triton kernels, unless cuBLAS beats it by SKINNY_MARGIN."""
    l2 = torch.cuda.get_device_properties(x.device).L2_cache_size
    # A read, not a write: dirty lines would be written back during the GEMM, adding 5-10 us to both candidates that a
    # model's forward, whose other kernels write little, does not pay.
    flush = torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device=x.device)
    # Each run gets its own copy of the prologue: a run sets its residual_out. The epilogue's stores repeat (the same
    # values at the same slots); after cuBLAS it runs unfused, as attention then runs it.
    fresh = lambda: dataclasses.replace(prologue) if prologue is not None else None  # noqa: E731

    def cublas():
        y = F.linear(apply(fresh(), x), weight, bias)
        if epilogue is not None:
            epilogue.unfused(y)

    words = flush.view(torch.int32)
    runs = [lambda k=k: k(x, weight, bias, fresh(), epilogue) for k in kernels.values()]
    *triton_us, cublas_us = _time_us(runs + [cublas], lambda: torch.amax(words))
    best_us, best = min(zip(triton_us, kernels))
    return best if best_us < SKINNY_MARGIN * cublas_us else GemmKernel.CUBLAS


def _skinny_mma(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prologue: None,
                epilogue: None) -> torch.Tensor:
    from radixlm.runtime.kernels.gemm.skinny_mma import skinny_mma_linear

    return skinny_mma_linear(x, weight, bias)


def few_row_kernels(x: torch.Tensor, weight: torch.Tensor, prologue: Prologue | None
                    ) -> tuple[int, dict[GemmKernel, Callable[..., torch.Tensor]]] | None:
    """(choice key, the Triton kernels that may run this GEMM), or None where none may. The key is the row count up to
    SKINNY_MAX_M, past it the tensor-core kernel's BLOCK_M. Each kernel takes (x, weight, bias, prologue, epilogue); a
    prologue here is one the skinny kernel fuses (at most PROLOGUE_MAX_M rows), which the tensor-core kernel does not
    take."""
    from radixlm.runtime.kernels.gemm import skinny_gemm
    from radixlm.runtime.kernels.gemm import skinny_mma

    kernels = {}
    if skinny_gemm.usable(x, weight, prologue):
        kernels[GemmKernel.SKINNY] = skinny_gemm.skinny_linear
    if prologue is None and skinny_mma.usable(x, weight):
        kernels[GemmKernel.SKINNY_MMA] = _skinny_mma
    if not kernels:
        return None
    m = x.shape[0]
    return (m if m <= skinny_gemm.SKINNY_MAX_M else skinny_mma.block_rows(m)), kernels


def choice_keys() -> tuple[int, ...]:
    """Every key of a layer's choice memo: the row counts up to SKINNY_MAX_M, then the tensor-core kernel's
    BLOCK_Ms."""
    from radixlm.runtime.kernels.gemm import skinny_gemm
    from radixlm.runtime.kernels.gemm import skinny_mma

    return tuple(range(1, skinny_gemm.SKINNY_MAX_M + 1)) + skinny_mma.MMA_ROWS


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None,
           choices: dict | None = None, prologue: Prologue | None = None,
           epilogue: RotaryStore | None = None) -> torch.Tensor:
    """choices: the calling layer's memo (None: always cuBLAS on CUDA): choice key (few_row_kernels) -> the kernel
    measured fastest, and past the few-row kernels' rows, row count -> a tuned cuBLASLt GEMM (an LtGemm, bit-identical
    to cuBLAS's; ModelRunner loads them) where the tuned table has one. prologue: x is the input before that step
    (prologue.py). epilogue: applied (and marked) where the skinny kernel runs and takes it; left to the caller
    otherwise. A BatchInvariantMemo (--enable-deterministic-inference) takes the batch-invariant GEMM on every
    device and row count, its prologue unfused and its epilogue left to the caller."""
    if isinstance(choices, batch_invariant.BatchInvariantMemo):
        return batch_invariant.linear(apply(prologue, x), weight, bias, packed)
    if not x.is_cuda:
        return cpu_gemm.linear(apply(prologue, x), weight, bias, packed)
    if choices is not None and x.dim() == 2:
        from radixlm.runtime.kernels.gemm import skinny_gemm

        if prologue is not None and x.shape[0] > skinny_gemm.PROLOGUE_MAX_M:
            x, prologue = prologue.apply(x), None  # fused, it would lose here
        if epilogue is not None and not skinny_gemm.takes_epilogue(x, weight, epilogue):
            epilogue = None
        found = few_row_kernels(x, weight, prologue)
        if found is not None:
            key, kernels = found
            choice = choices.get(key)
            if choice is None and not torch.cuda.is_current_stream_capturing():
                choice = choices[key] = _fastest(kernels, x, weight, bias, prologue, epilogue)
            kernel = kernels.get(choice)
            if kernel is not None:
                return kernel(x, weight, bias, prologue, epilogue)
        elif bias is None and prologue is None and x.is_contiguous():
            tuned = choices.get(x.shape[0])
            if tuned is not None and not isinstance(tuned, GemmKernel):
                return tuned(x, weight)
    return F.linear(apply(prologue, x), weight, bias)
