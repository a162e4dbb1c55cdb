"""What a ModelRunner builds around its loaded model, by the flags: the LoRA adapters (--enable-lora), the
batch-invariant GEMMs (--enable-deterministic-inference), the pooler (--is-embedding) and the attention backend."""
from __future__ import annotations

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.executor.pooler import Pooler, PoolingConfig
from radixlm.runtime.kernels import gemm
from radixlm.runtime.layers.attention.deterministic import DeterministicAttnBackend
from radixlm.runtime.layers.attention.torch_native import TorchNativeAttnBackend
from radixlm.runtime.layers.attention.triton_backend import TritonAttnBackend
from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.model_loader.config import ModelConfig

ATTENTION_BACKENDS = {"torch_native": TorchNativeAttnBackend, "triton": TritonAttnBackend}


def is_causal(model: torch.nn.Module) -> bool:
    """Whether a row attends only to those before it (a decoder): only then can a cached prefix stand in for a
    prompt's first rows."""
    return getattr(model, "is_causal", True)


def lora_manager(model: torch.nn.Module, args: ServerArgs, cfg: ModelConfig, device: str, parallel: Parallel):
    """The adapters' manager with --lora-paths loaded."""
    from radixlm.runtime.lora.manager import LoraManager, LoraOptions
    from radixlm.runtime.lora.registry import startup_refs

    manager = LoraManager(model, LoraOptions.from_args(args), cfg.num_layers, cfg.dtype, device, parallel.tp_rank)
    for ref in startup_refs(args.lora_paths):
        manager.load_adapter(ref.lora_id, ref.lora_name, ref.lora_path)
    return manager


def make_batch_invariant(model: torch.nn.Module, holders: list[tuple[str, gemm.GemmHolder]]) -> None:
    """--enable-deterministic-inference: every GEMM through the batch-invariant one; refused for layers that have
    no batch-invariant form here (quantized GEMMs, MoE routing and grouping) and for bidirectional attention."""
    if not is_causal(model):
        raise ValueError("--enable-deterministic-inference needs a causal (decoder) model")
    unsupported = sorted({type(m).__name__ for m in model.modules()
                          if getattr(m, "quant_method", None) is not None or isinstance(m, FusedMoE)})
    if unsupported:
        raise ValueError(f"--enable-deterministic-inference has no batch-invariant form of this model's "
                         f"{', '.join(unsupported)} layers (quantized or MoE)")
    for _, holder in holders:
        holder.gemm_choices = gemm.BatchInvariantMemo()


def pooler_for(model: torch.nn.Module, cfg: ModelConfig) -> Pooler:
    """--is-embedding: the model's classifier head's scores, else its pooled hidden states."""
    classify = getattr(model, "classify", None)
    config = PoolingConfig.from_model_dir(cfg.model_path, is_causal(model))
    dim = cfg.hf_config.num_labels if classify is not None else cfg.hidden_size
    return Pooler(config, dim, classify)


def attention_backend(runner, args: ServerArgs, is_cuda: bool):
    """--attention-backend (auto: triton on CUDA, else torch_native); the deterministic one under
    --enable-deterministic-inference."""
    if args.enable_deterministic_inference:
        return DeterministicAttnBackend(runner)
    backend = args.attention_backend
    if backend == "auto":
        backend = "triton" if is_cuda else "torch_native"
    return ATTENTION_BACKENDS[backend](runner)
