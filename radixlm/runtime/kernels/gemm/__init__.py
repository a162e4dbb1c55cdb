"""The one GEMM entry point of the linear layers and the lm_head (`linear`, dispatch.py) and what it chooses among:
the few-row Triton kernels (skinny_gemm.py up to SKINNY_MAX_M rows, skinny_mma.py on the tensor cores up to
MMA_MAX_M), tuned cuBLASLt configurations (cublaslt.py, tuned_gemm.py, tables in tuned/), oneDNN-packed weights on
CPU (cpu_gemm.py), and in deterministic mode the batch-invariant GEMM instead of all of them (batch_invariant.py);
the element-wise step a GEMM may fuse before it (prologue.py) and the qkv GEMM's rotary embedding
and KV store after it (epilogue.py); the layers' choice memos (choices.py)."""
from radixlm.runtime.kernels.gemm.batch_invariant import BatchInvariantMemo
from radixlm.runtime.kernels.gemm.choices import GemmHolder, format_gemm_choices, gemm_choice_counts, share_gemm_choices
from radixlm.runtime.kernels.gemm.cpu_gemm import pack_weight
from radixlm.runtime.kernels.gemm.dispatch import GemmKernel, choice_keys, kernel_of, linear
from radixlm.runtime.kernels.gemm.epilogue import MAX_ROWS as EPILOGUE_MAX_ROWS, RotaryStore, kernel_head_dim
from radixlm.runtime.kernels.gemm.prologue import Prologue, PrologueKind, apply as apply_prologue
from radixlm.runtime.kernels.lazy import lazy_names

__getattr__ = lazy_names(__name__, {
    "SKINNY_MAX_M": "skinny_gemm", "prebuild_skinny": "skinny_gemm:prebuild", "inline_builds": "skinny_gemm",
    "MMA_ROWS": "skinny_mma", "MMA_MAX_M": "skinny_mma", "prebuild_mma": "skinny_mma:prebuild",
    "install_tuned": "tuned_gemm:install"})

__all__ = ["BatchInvariantMemo", "EPILOGUE_MAX_ROWS", "GemmHolder", "GemmKernel", "MMA_MAX_M", "MMA_ROWS",
           "Prologue", "PrologueKind", "RotaryStore", "SKINNY_MAX_M", "apply_prologue", "choice_keys",
           "format_gemm_choices", "gemm_choice_counts", "inline_builds", "install_tuned", "kernel_head_dim",
           "kernel_of", "linear", "pack_weight", "prebuild_mma", "prebuild_skinny", "share_gemm_choices"]
