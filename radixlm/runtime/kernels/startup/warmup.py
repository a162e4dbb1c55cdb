"""Start-up's kernel warm-up of one model runner: before the first request, every Triton kernel variant that eager
passes can meet is built (CUDA-graph capture builds those of the captured passes; kernel_variants.py lists them and
why). Otherwise the first pass that needs one waits for the compiler (0.1-0.6 s each on an H100) in the middle of
serving. The runner supplies the passes (WarmupRunner); the layers tell which kernels its model launches."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from radixlm.runtime.kernels import attention, elementwise, gemm, quant
from radixlm.runtime.kernels.elementwise import argmax_rows
from radixlm.runtime.kernels.moe import TRITON_CHUNK_TOKENS, fused_experts_triton, reachable_configs
from radixlm.runtime.kernels.startup.kernel_builds import ParallelBuilds
from radixlm.runtime.kernels.startup.kernel_variants import WarmupPlan, uses_tree_masks, warmup_plan
from radixlm.runtime.layers.attention.triton_backend import TritonAttnBackend
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.layers.radix_attention import RadixAttention

if TYPE_CHECKING:
    from radixlm.runtime.executor.logits import LogitsOutput
    from radixlm.runtime.layers.attention.base import AttentionBackend

logger = logging.getLogger(__name__)


class WarmupRunner(Protocol):
    """What the warm-up reads of a model runner (executor.ModelRunner)."""

    device: str
    model: nn.Module
    model_config: Any  # context_len, dtype, head_dim
    server_args: Any  # the speculative settings (uses_tree_masks)
    num_kv_heads: int
    kv_cache_dtype: torch.dtype
    attn_backend: AttentionBackend
    mm_embedder: object | None

    @property
    def is_cuda(self) -> bool: ...

    @property
    def max_pass_rows(self) -> int: ...  # the most rows a decode pass can have

    @property
    def takes_shared_prefixes(self) -> bool: ...

    def gemm_holders(self) -> list[tuple[str, gemm.GemmHolder]]: ...

    def warm_up_extend(self, tree_masks: bool = False) -> None: ...

    def warm_up_token_rows(self, bs: int, seq_len: int) -> LogitsOutput: ...


def prepare_gemms(runner: WarmupRunner, tuned: bool, share: bool = True) -> None:
    """At load: on CPU the layers pack their weights for oneDNN; with `share`, the layers of one kind share their GEMM
    choice memo; with `tuned` (not --disable-tuned-gemm), a 16-bit model on CUDA takes the tuned cuBLASLt GEMMs of
    this GPU model's table into the memos."""
    if torch.device(runner.device).type == "cpu":
        for module in runner.model.modules():
            if hasattr(module, "pack_for_cpu"):
                module.pack_for_cpu()
    if share:
        gemm.share_gemm_choices(runner.gemm_holders())
    if tuned and runner.is_cuda and runner.model_config.dtype in (torch.bfloat16, torch.float16):
        logger.info("tuned cuBLASLt GEMMs installed: %d", gemm.install_tuned(runner.gemm_holders(), runner.device))


def plan_warmup(runner: WarmupRunner, graph_max_bs: int) -> WarmupPlan:
    has_moe = any(isinstance(m, FusedMoE) for m in runner.model.modules())
    return warmup_plan(runner.model_config.context_len, runner.num_kv_heads, graph_max_bs,
                       eager_token_rows_any_size=runner.mm_embedder is not None, has_moe=has_moe,
                       tree_masks=uses_tree_masks(runner.server_args, runner.attn_backend.supports_tree_mask),
                       shared_prefix=runner.takes_shared_prefixes, max_rows=runner.max_pass_rows)


@torch.inference_mode()
def warm_up_kernels(runner: WarmupRunner, graph_max_bs: int) -> None:
    """Builds (in parallel on CUDA) and runs every kernel variant the plan lists, with dummy passes that leave the
    pools as they were."""
    t0 = time.perf_counter()
    plan = plan_warmup(runner, graph_max_bs)
    if runner.is_cuda:
        build_in_parallel(runner, plan)
    warm_up_passes(runner, plan)
    if runner.is_cuda:
        torch.cuda.synchronize()
    logger.info("kernel warm-up (eager passes of %s rows, decode splits %s%s%s%s) in %.2f s",
                list(plan.token_row_batches), plan.decode_splits, ", MoE configs" if plan.moe else "",
                ", tree masks" if plan.tree_masks else "",
                f", shared prefixes {plan.shared_prefix}" if plan.shared_prefix else "", time.perf_counter() - t0)
    choices = gemm.gemm_choice_counts(runner.gemm_holders())
    if choices:
        logger.info("few-row GEMMs' kernels (rows or padded rows: kernel layers): %s",
                    gemm.format_gemm_choices(choices))


def build_in_parallel(runner: WarmupRunner, plan: WarmupPlan) -> None:
    """Builds in threads (kernel_builds.py) what the warm-up passes would build one kernel after another: the skinny
    GEMM's autotune configs, the tensor-core GEMM's variants, and (but for MoE models) what a discovery run of the
    passes launches unbuilt."""
    t0 = time.perf_counter()
    # Inline: the autotuned skinny GEMM, the decode work list (its table indexes the decode kernels' reads), and the
    # collective all-reduce + norm (a launch skipped on one rank only would leave its peers waiting).
    builds = ParallelBuilds(runner.device,
                            inline=gemm.inline_builds() + attention.inline_builds() + elementwise.inline_builds())
    dtype = runner.model_config.dtype
    # Deterministic mode's GEMMs are the batch-invariant kernel's alone: the few-row kernels never run.
    if dtype in (torch.bfloat16, torch.float16) and not runner.server_args.enable_deterministic_inference:
        modules = list(runner.model.modules())
        biases = tuple(sorted({False} | {m.bias is not None for m in modules if isinstance(m, Linear)}))
        head_dim = runner.model_config.head_dim
        epilogue = gemm.kernel_head_dim(head_dim) and any(getattr(m, "takes_rotary_epilogue", False)
                                                          for m in modules)
        gemm.prebuild_skinny(builds, dtype, runner.device, biases, head_dim if epilogue else 0, runner.kv_cache_dtype)
        gemm.prebuild_mma(builds, dtype, runner.device, biases)
    if not plan.moe:
        discover_kernels(runner, plan, builds)
    n = builds.finish()
    logger.info("kernel warm-up: %d kernels built or loaded in parallel in %.2f s", n, time.perf_counter() - t0)


def discover_kernels(runner: WarmupRunner, plan: WarmupPlan, builds: ParallelBuilds) -> None:
    """The warm-up passes with unbuilt kernels' launches skipped and their builds handed to `builds`. Their few-row
    GEMMs take cuBLAS, unmeasured (the builds load the host): the real run measures them."""
    holders = [h for _, h in runner.gemm_holders()]
    measured = [h.gemm_choices for h in holders]
    try:
        for h in holders:
            h.gemm_choices = dict.fromkeys(gemm.choice_keys(), gemm.GemmKernel.CUBLAS)
        with builds.discover():
            warm_up_passes(runner, plan)
    finally:
        for h, choices in zip(holders, measured):
            h.gemm_choices = choices


def warm_up_passes(runner: WarmupRunner, plan: WarmupPlan) -> None:
    runner.warm_up_extend(tree_masks=plan.tree_masks)
    # Every row count up to the skinny GEMM's limit and one per tensor-core BLOCK_M (the layers' Triton-vs-cuBLAS
    # choices), then the decode stages at each split count an eager decode pass can meet.
    passes = [(bs, 1) for bs in plan.token_row_batches]
    if isinstance(runner.attn_backend, TritonAttnBackend):
        passes += plan.split_passes
    for bs, seq_len in passes:
        out = runner.warm_up_token_rows(bs, seq_len)
        if runner.is_cuda:
            # The sampler's greedy kernels (a Triton pair on CUDA): on the model's dtype in a plain greedy pass, on
            # float32 after penalties or a grammar's mask.
            argmax_rows(out.next_token_logits)
            argmax_rows(out.as_float().next_token_logits)
    if plan.shared_prefix:
        runner.attn_backend.warm_up_shared_prefix(
            next(m for m in runner.model.modules() if isinstance(m, RadixAttention)), plan.shared_prefix)
    if plan.moe and runner.is_cuda:
        warm_up_moe(runner)
    if runner.is_cuda:
        warm_up_quantized(runner)


def warm_up_quantized(runner: WarmupRunner) -> None:
    """Each quantized linear layer once per row bucket of its kernels (kernels.quant.warm_up_linear) and at the row
    counts its method adds (warmup_rows: W4A16's dequantize-then-GEMM path): prefill passes reach buckets that the
    decode and extend passes above do not."""
    dtype = runner.model_config.dtype
    for m in runner.model.modules():
        method = getattr(m, "quant_method", None)
        if method is not None and isinstance(m, Linear):
            extra = method.warmup_rows(m, dtype) if hasattr(method, "warmup_rows") else ()
            quant.warm_up_linear(lambda x, m=m, method=method: method.apply(m, x, m.bias), m.in_features, dtype,
                                 runner.device, extra_rows=extra)


def warm_up_moe(runner: WarmupRunner) -> None:
    """Each MoE layer shape once per GEMM config a pass can reach (one token: the config is forced). Quantized
    experts with grouped kernels of their own (the method's grouped_experts: kernels.moe.quant_moe) build every
    variant of those (quant_moe.warm_up_grouped: configs, w8a8 or not, K split or not); those without (an FP8
    model on a GPU before compute capability 8.9, a group size no K tile divides) run the float kernel on their
    dequantized weights, and warm that."""
    from radixlm.runtime.kernels.moe import quant_moe

    seen = set()
    dtype = runner.model_config.dtype
    device = torch.device(runner.device)
    for m in runner.model.modules():
        if not isinstance(m, FusedMoE):
            continue
        if m.quant_method is not None:
            grouped = getattr(m.quant_method, "grouped_experts", None)
            experts = grouped(m, dtype, device) if grouped is not None else None
            if experts is not None:
                key = ("grouped", quant_moe.variant_key(*experts), m.top_k, m.expert_start, m.num_experts)
                if key not in seen:
                    seen.add(key)
                    quant_moe.warm_up_grouped(*experts, m.top_k, m.expert_start, m.num_experts, dtype, device)
                continue
            if not hasattr(m.quant_method, "dequantized"):
                continue  # a method with kernels of its own warms them itself
            w13 = m.quant_method.dequantized(m, "w13", dtype)
            w2 = m.quant_method.dequantized(m, "w2", dtype)
        else:
            w13, w2 = m.w13_weight, m.w2_weight
        key = (tuple(w13.shape), tuple(w2.shape), w13.dtype, m.top_k, m.expert_start, m.num_experts)
        if key in seen:
            continue
        seen.add(key)
        hidden = torch.zeros(1, w13.shape[2], dtype=w13.dtype, device=runner.device)
        ids = (torch.arange(m.top_k, dtype=torch.int32, device=runner.device) % m.num_experts).reshape(1, -1)
        weights = torch.ones(1, m.top_k, dtype=torch.float32, device=runner.device)
        for cfg in reachable_configs(TRITON_CHUNK_TOKENS, m.top_k, w13.shape[0], w13.dtype):
            fused_experts_triton(hidden, w13, w2, weights, ids, m.expert_start, m.num_experts, config=cfg)
