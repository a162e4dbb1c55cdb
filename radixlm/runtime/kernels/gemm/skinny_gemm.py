"""y = x @ W.T for the few rows of a small decode batch (M <= SKINNY_MAX_M), bf16/fp16 on CUDA (Triton).

At batch 1-4 a decode step is a stream of weight reads; cuBLAS' kernels for these shapes reach ~88% of the copy
bandwidth. Here each program reads a [BLOCK_N, K] band of W once, in BLOCK_K steps, and reduces it against every
row of x; accumulation is in float32 and the result is rounded once, as F.linear does. Tile sizes are autotuned per
(N, K, M, prologue) during the warm-up runs that precede CUDA-graph capture.

A prologue (prologue.py) is the input's last element-wise step, done on the loads: every program computes the
rows' RMS norms (of x + residual) from L2 before its loop, and program 0 writes the residual sum; SiLU-and-mul reads
[gate | up]. At one row this saves ~0.4-1.7 us a GEMM over the step's own kernel
(benchmarks/results/kernels/h100/prologue_probe.json; the probe is retired, see benchmarks/RETIRED.md); at 2-4 rows
it loses, so gemm.linear fuses only at PROLOGUE_MAX_M rows (the kernel takes a prologue at any M).

An epilogue (epilogue.py, at one row: EPILOGUE_MAX_M) is the qkv projection's rotary embedding and KV store:
each program then computes BLOCK_N // 2 dims of one head and the same dims of the head's second half (the rotation's
pairs), rotates q and k as fused_kernels.rotary_ does, with its roundings, and stores k and v at the token's slot. On
the 8B model's qkv shape that took 21.7 us against 25.1 for this GEMM followed by the rotary kernel with its store
(benchmarks/results/kernels/h100/epilogue/; the probe is retired, see benchmarks/RETIRED.md).

M is a constexpr: each row count is its own set of compiled kernels. CUDA graphs pad decode batches to 1, 2, 4, 8, ...
rows, so 3 rows arise only in eager passes (a prefill pass sampling three requests); they run the 4-row kernel on
a padded copy (each row's sum is computed alike whatever M is), and no kernel is built for them."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
import triton.testing

from radixlm.runtime.kernels.gemm.epilogue import MAX_ROWS as EPILOGUE_MAX_M, RotaryStore
from radixlm.runtime.kernels.gemm.epilogue import kernel_args as epilogue_args
from radixlm.runtime.kernels.gemm.fused_steps import epilogue_columns, inv_rms, prologue_values, rotary_store
from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind, apply
from radixlm.runtime.kernels.pdl import pdl_options, pdl_wait

if TYPE_CHECKING:
    from radixlm.runtime.kernels.startup import ParallelBuilds

SKINNY_MAX_M = 4
SKINNY_ROWS = (1, 2, 4)  # the kernel's row counts (M); other row counts up to SKINNY_MAX_M pad to the next one
# gemm.linear fuses a prologue up to this many rows only: at 2 and 4 rows the fused kernel lost to the step's own
# kernel followed by the skinny kernel or cuBLAS (gate_up at 2 rows: 93.6 us against 85.3; prologue_probe.json).
PROLOGUE_MAX_M = 1

# The epilogue's kernels run one config, not autotuned: autotuning them at start-up built 24 more kernels, and a cold
# Engine() of the 8B model took 34.6 s against 25.2 (one run each, an H100). This config ran the epilogue's qkv GEMM in
# 21.9 us, the autotuned one in 21.7, the other configs in 21.8-26.4 (kernels_h100/epilogue/epilogue_probe.json).
EPILOGUE_CONFIG = triton.Config({"BLOCK_N": 8, "BLOCK_K": 512}, num_warps=4, num_stages=3)

_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
            for bn, bk, w, s in ((8, 512, 4, 3), (16, 256, 4, 4), (16, 512, 4, 3), (32, 256, 8, 3),
                                 (8, 1024, 8, 2), (16, 1024, 8, 2), (4, 1024, 4, 3), (4, 1024, 8, 3))]


def _bench(kernel_call, quantiles):
    # A skinny GEMM takes 5-50 us: 20 ms is hundreds of runs a config. Triton's default (25 + 100 ms a config) cost
    # 12 s of every start-up of an 8B model (15 shapes x 7 configs; benchmarks/startup/startup_profile.py on the H100).
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


@triton.jit
def _input_block(X, R, NW, RO, k, k_mask, K, inv, res_end, PRO: tl.constexpr):
    """One row's inputs at columns k, after the prologue (fused_steps.prologue_values), in float32."""
    x = tl.load(X + k, mask=k_mask, other=0.0)
    if PRO == 0:
        return x.to(tl.float32)
    if PRO == 3:
        y, x = prologue_values(x, tl.load(X + K + k, mask=k_mask, other=0.0), x, inv, PRO)
    else:
        r = x
        if PRO == 2:
            r = tl.load(R + k, mask=k_mask, other=0.0)
        y, x = prologue_values(x, r, tl.load(NW + k, mask=k_mask, other=0.0), inv, PRO)
        if PRO == 2:
            tl.store(RO + k, x, mask=k < res_end)  # res_end: K in program 0, else 0
    return y


# cache_results: the choices persist beside the compiled kernels (Triton's cache), so a warm start-up skips them.
# Pos and Loc are views of a pass's rows at any offset (see kernel_variants.py).
@triton.autotune(configs=_CONFIGS, key=["N", "K", "M", "PRO"], do_bench=_bench, cache_results=True)
@triton.jit(do_not_specialize_on_alignment=["Pos", "Loc"])
def _skinny_kernel(X, W, B, Y, NW, R, RO, Pos, CosSin, Loc, KBuf, VBuf, N, K, stride_xm, stride_wn, stride_ym,
                   stride_rm, eps, n_q, n_kv, stride_cs, stride_kb, stride_vb, k_scale, v_scale,
                   M: tl.constexpr, HAS_BIAS: tl.constexpr, PRO: tl.constexpr, EPI: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   NORM_BLOCK: tl.constexpr = 4096, PDL: tl.constexpr = False):
    pid = tl.program_id(0)
    res_end = tl.where(pid == 0, K, 0)
    if EPI:
        offs_n, head0, j0 = epilogue_columns(pid, HEAD_DIM, BLOCK_N)
    else:
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = W + offs_n[:, None] * stride_wn + offs_k[None, :]
    # No weight read before the wait here, unlike the quantized GEMVs: the first tile prefetched to L2 (4.27 ms a
    # bf16 step at one row against 4.23 without PDL) or loaded to registers (4.61 against 4.49) lost; waiting first,
    # 4.20 against 4.21 (H200, benchmarks/results/offline/quant/pdl/).
    pdl_wait(PDL)
    inv0 = 1.0
    inv1 = 1.0
    inv2 = 1.0
    inv3 = 1.0
    # Every program computes the rows' norms (a few KiB each, from L2) in NORM_BLOCK-wide steps: with BLOCK_K-wide
    # ones, each an L2 round trip before the first weight load, gate_up's fused add-and-norm took 63.6 us at one row
    # against 61.6 (59.6 without a prologue; H200, benchmarks/results/kernels/h200/skinny_prologues/).
    if PRO == 1 or PRO == 2:
        inv0 = inv_rms(X, R, K, eps, PRO, NORM_BLOCK)
        if M > 1:
            inv1 = inv_rms(X + stride_xm, R + stride_rm, K, eps, PRO, NORM_BLOCK)
        if M > 2:
            inv2 = inv_rms(X + 2 * stride_xm, R + 2 * stride_rm, K, eps, PRO, NORM_BLOCK)
        if M > 3:
            inv3 = inv_rms(X + 3 * stride_xm, R + 3 * stride_rm, K, eps, PRO, NORM_BLOCK)
    acc0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        w = tl.load(w_ptrs + k0, mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        x0 = _input_block(X, R, NW, RO, k, k_mask, K, inv0, res_end, PRO)
        acc0 += tl.sum(w * x0[None, :], axis=1)
        if M > 1:
            x1 = _input_block(X + stride_xm, R + stride_rm, NW, RO + K, k, k_mask, K, inv1, res_end, PRO)
            acc1 += tl.sum(w * x1[None, :], axis=1)
        if M > 2:
            x2 = _input_block(X + 2 * stride_xm, R + 2 * stride_rm, NW, RO + 2 * K, k, k_mask, K, inv2, res_end, PRO)
            acc2 += tl.sum(w * x2[None, :], axis=1)
        if M > 3:
            x3 = _input_block(X + 3 * stride_xm, R + 3 * stride_rm, NW, RO + 3 * K, k, k_mask, K, inv3, res_end, PRO)
            acc3 += tl.sum(w * x3[None, :], axis=1)
    if HAS_BIAS:
        b = tl.load(B + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        acc0 += b
        acc1 += b
        acc2 += b
        acc3 += b
    out_ty = Y.dtype.element_ty
    if EPI:
        rotary_store(acc0.to(out_ty), Y, offs_n, head0, j0, Pos, CosSin, Loc, KBuf, VBuf, n_q, n_kv, stride_cs,
                      stride_kb, stride_vb, k_scale, v_scale, HEAD_DIM, BLOCK_N)
    else:
        tl.store(Y + offs_n, acc0.to(out_ty), mask=n_mask)
    if M > 1:
        tl.store(Y + stride_ym + offs_n, acc1.to(out_ty), mask=n_mask)
    if M > 2:
        tl.store(Y + 2 * stride_ym + offs_n, acc2.to(out_ty), mask=n_mask)
    if M > 3:
        tl.store(Y + 3 * stride_ym + offs_n, acc3.to(out_ty), mask=n_mask)


def inline_builds() -> tuple:
    """The kernels a discovery run (kernel_builds.ParallelBuilds) must build inline: the autotuned one (its timing
    would time nothing)."""
    return (_skinny_kernel.fn,)


def usable(x: torch.Tensor, weight: torch.Tensor, prologue: Prologue | None = None) -> bool:
    if not (x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= SKINNY_MAX_M and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and x.stride(1) == 1 and weight.stride(1) == 1):
        return False
    return prologue is None or (prologue.in_features(x) == weight.shape[1] and prologue.fits(x))


def takes_epilogue(x: torch.Tensor, weight: torch.Tensor, epilogue: RotaryStore) -> bool:
    return x.shape[0] <= EPILOGUE_MAX_M and x.dtype == weight.dtype and epilogue.fits(x, weight)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  prologue: Prologue | None = None, epilogue: RotaryStore | None = None) -> torch.Tensor:
    """x: (M, K) with M <= SKINNY_MAX_M, or (M, 2K) = [gate | up] with a SILU_MUL prologue; weight: (N, K); returns
    (M, N) in x's dtype. An ADD_RMSNORM prologue gets its residual_out (M, K); an epilogue (takes_epilogue) is
    applied and marked so."""
    m = x.shape[0]
    assert epilogue is None or m <= EPILOGUE_MAX_M
    rows = next(r for r in SKINNY_ROWS if r >= m)
    if rows != m:  # (gemm.linear fuses no prologue at these rows: one here runs unfused)
        x = apply(prologue, x)
        padded = x.new_zeros(rows, x.shape[1])
        padded[:m] = x
        return skinny_linear(padded, weight, bias)[:m]
    n, k = weight.shape
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    kind = 0 if prologue is None else int(prologue.kind)
    nw = r = r_out = weight
    eps, stride_r = 0.0, 0
    if prologue is not None and prologue.kind is not PrologueKind.SILU_MUL:
        nw, eps = prologue.norm_weight, prologue.eps
        if prologue.residual is not None:
            r, stride_r = prologue.residual, prologue.residual.stride(0)
            r_out = prologue.residual_out = torch.empty(m, k, dtype=x.dtype, device=x.device)
    epi_ptrs, epi_ints, head_dim = epilogue_args(epilogue, weight)
    args = (x, weight, bias if bias is not None else weight, y, nw, r, r_out, *epi_ptrs, n, k, x.stride(0),
            weight.stride(0), y.stride(0), stride_r, eps, *epi_ints)
    flags = dict(M=m, HAS_BIAS=bias is not None, PRO=kind, EPI=epilogue is not None, HEAD_DIM=head_dim,
                 **pdl_options(x.device, m))
    if epilogue is None:
        _skinny_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](*args, **flags)
        return y
    _skinny_kernel.fn[(n // EPILOGUE_CONFIG.kwargs["BLOCK_N"],)](*args, **flags, **EPILOGUE_CONFIG.all_kwargs())
    epilogue.applied = True
    return y


def prebuild(builds: ParallelBuilds, dtype: torch.dtype, device: torch.device | str,
             biases: tuple[bool, ...] = (False,), epilogue_head_dim: int = 0, kv_dtype: torch.dtype | None = None) -> int:
    """Hands `builds` the kernel of every autotune config for each row count, prologue kind (or none; up to
    PROLOGUE_MAX_M rows) and bias flag, and with epilogue_head_dim (a model whose qkv GEMM takes a RotaryStore) the
    epilogue's at one row (EPILOGUE_CONFIG alone; after any prologue a qkv GEMM gets: none, RMSNORM, ADD_RMSNORM), so
    that the warm-up's autotuning and launches find them built (the autotuner builds its configs one after another:
    ~0.16 s each with an empty cache); returns how many. A kernel already built, in memory or on disk, costs only its
    lookup. kv_dtype: the KV pool's (the epilogue stores into it; default dtype).

    NOTE: the launch must specialize as skinny_linear's does (Triton keys a kernel on each argument's dtype, on
    whether an int is 1 or a multiple of 16 and on a pointer's 16-byte alignment): N, K, the row strides and the
    epilogue's widths are multiples of 16 here, as the models' are; a width that is not costs one build in the
    warm-up, as before."""
    n, k = 64, 64
    w = torch.empty(n, k, dtype=dtype, device=device)
    xs = {m: torch.empty(m, 2 * k, dtype=dtype, device=device) for m in SKINNY_ROWS}
    r = torch.empty(SKINNY_MAX_M, k, dtype=dtype, device=device)
    nw = torch.empty(k, dtype=dtype, device=device)
    y = torch.empty(SKINNY_MAX_M, n, dtype=dtype, device=device)
    rows = torch.empty(1, dtype=torch.int64, device=device)  # positions, KV slots
    cos_sin = torch.empty(1, 64, dtype=torch.float32, device=device)
    kv = torch.empty(n, k, dtype=kv_dtype or dtype, device=device)

    def build(m: int, pro: int, bias: bool, head_dim: int, cfg: triton.Config) -> None:
        norm = pro in (PrologueKind.RMSNORM, PrologueKind.ADD_RMSNORM)
        add = pro == PrologueKind.ADD_RMSNORM
        epi = (rows, cos_sin, rows, kv, kv, 64, 64, 64, 64, 64) if head_dim else (w, w, w, w, w, 0, 0, 0, 0, 0)
        # As skinny_linear passes them; options in the autotuner's order (Triton's in-memory key lists them as
        # passed): M, HAS_BIAS, PRO, EPI, HEAD_DIM, the PDL options, then the config.
        _skinny_kernel.fn.warmup(xs[m], w, w, y, nw if norm else w, r if add else w, r if add else w, *epi[:5], n, k,
                                 xs[m].stride(0), w.stride(0), y.stride(0), r.stride(0) if add else 0,
                                 1e-5 if norm else 0.0, *epi[5:], 1.0, 1.0, M=m, HAS_BIAS=bias, PRO=pro, EPI=bool(head_dim),
                                 HEAD_DIM=head_dim, grid=(1,), **pdl_options(w.device, m),
                                 **cfg.all_kwargs())

    pros = [0] + [int(kind) for kind in PrologueKind]
    jobs = [(m, pro, bias, 0, cfg) for m in SKINNY_ROWS for pro in (pros if m <= PROLOGUE_MAX_M else [0])
            for bias in biases for cfg in _CONFIGS]
    if epilogue_head_dim:
        qkv_pros = (0, int(PrologueKind.RMSNORM), int(PrologueKind.ADD_RMSNORM))
        jobs += [(m, pro, bias, epilogue_head_dim, EPILOGUE_CONFIG) for m in SKINNY_ROWS if m <= EPILOGUE_MAX_M
                 for pro in qkv_pros if m <= PROLOGUE_MAX_M or not pro for bias in biases]
    build(*jobs[0])  # here: the first build sets up the kernel's per-device state, which the threads then share
    for job in jobs[1:]:
        builds.submit(build, *job)
    return len(jobs)
