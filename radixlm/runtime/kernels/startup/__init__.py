"""What start-up builds before the first request: the inventory of Triton kernel variants serving can meet and the
warm-up plan that covers them (kernel_variants.py), builds in a thread pool (kernel_builds.py), and the warm-up of
one model runner (warmup.py: ModelRunner calls prepare_gemms at load and warm_up_kernels before graph capture)."""
from radixlm.runtime.kernels.startup.kernel_builds import ParallelBuilds
from radixlm.runtime.kernels.startup.kernel_variants import (
    EXTEND_WARMUP_LENS, TOKEN_ROW_WARMUP, WarmupPlan, decode_eager_splits, mma_warmup_rows, shared_prefix_warmup,
    uses_tree_masks, warmup_plan)
from radixlm.runtime.kernels.startup.warmup import WarmupRunner, plan_warmup, prepare_gemms, warm_up_kernels

__all__ = ["EXTEND_WARMUP_LENS", "ParallelBuilds", "TOKEN_ROW_WARMUP", "WarmupPlan", "WarmupRunner",
           "decode_eager_splits", "mma_warmup_rows", "plan_warmup", "prepare_gemms", "shared_prefix_warmup",
           "uses_tree_masks", "warm_up_kernels", "warmup_plan"]
