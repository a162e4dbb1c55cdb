"""DeepSeek-V3's multi-token-prediction layer as the EAGLE draft (SGLang's rule): --speculative-algorithm EAGLE over a
target whose checkpoint has MTP layers (num_nextn_predict_layers), with --speculative-draft-model-path unset or
the target's own directory, drafts with that layer (models/deepseek_mtp.py) through the EAGLE runner
(spec/runners/eagle.py): the same pairs (h_i, t_{i+1}), chains and trees, its KV in a latent pool of one layer over
the target's slots. What differs is only where the head comes from: here, its config and weights."""
from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator

import torch

from radixlm.runtime.args import ServerArgs, SpeculativeAlgorithm
from radixlm.runtime.model_loader.config import ModelConfig, resolve_model_dir

if TYPE_CHECKING:
    from radixlm.runtime.models.deepseek_mtp import DeepseekMTPHead

MTP_ARCHITECTURE = "DeepseekMTPHead"


def uses_mtp(args: ServerArgs, target: ModelConfig) -> bool:
    """Whether the EAGLE draft is the target's own MTP layer; raises where EAGLE has no head to load (no draft path
    and no MTP layer in the target)."""
    from radixlm.runtime.models.deepseek_mtp import num_mtp_layers

    if args.speculative_algorithm is not SpeculativeAlgorithm.EAGLE:
        return False
    path = args.speculative_draft_model_path
    if path is not None and os.path.realpath(resolve_model_dir(path)) != os.path.realpath(target.model_path):
        return False  # an EAGLE head of its own
    if num_mtp_layers(target.hf_config.get_text_config()) < 1 or _target_class(target) is None:
        raise ValueError(
            f"--speculative-algorithm EAGLE needs --speculative-draft-model-path (an EAGLE head): only a DeepSeek-V3-"
            f"style checkpoint with multi-token-prediction layers (num_nextn_predict_layers >= 1) drafts for itself, "
            f"and {target.model_path} ({target.architecture}) has none")
    return True


def _target_class(target: ModelConfig):
    """The target's model class where it is a DeepSeek MLA model (the MTP layer is built as its layers), else None."""
    from radixlm.runtime.models.deepseek_v2 import DeepseekV2ForCausalLM
    from radixlm.runtime.models.registry import get_model_class

    cls = get_model_class(target.architecture)
    return cls if issubclass(cls, DeepseekV2ForCausalLM) and target.mla is not None else None


def mtp_config(target: ModelConfig) -> ModelConfig:
    """The head's config: the target's, with one layer (its KV pool: one latent row per token)."""
    return replace(target, architecture=MTP_ARCHITECTURE, num_layers=1)


def build_mtp_head(target: ModelConfig, embed_tokens: torch.nn.Module | None) -> "DeepseekMTPHead":
    """The head (its decoder layer quantized as the target's layers are), under the caller's device and dtype."""
    from radixlm.runtime.models.deepseek_mtp import DeepseekMTPHead
    from radixlm.runtime.quantization import quantize_modules

    head = DeepseekMTPHead(target.hf_config.get_text_config(), embed_tokens, _target_class(target))
    quantize_modules(head.decoder, target.quant_config)
    return head


def mtp_weights(target: ModelConfig) -> Iterator[tuple[str, object]]:
    """The target checkpoint's tensors, read lazily (the head keeps its layer's)."""
    from radixlm.runtime.model_loader.loader import safetensors_files, safetensors_weights_iterator

    return safetensors_weights_iterator(safetensors_files(target.model_path))


def mtp_weight_bytes(target: ModelConfig) -> int:
    """The head's parameters as loaded (built on the meta device in the target's dtype; the router stays float32;
    the shared embeddings and lm_head are the target's)."""
    from radixlm.runtime.model_loader.loader import _default_dtype

    with torch.device("meta"), _default_dtype(target.dtype):
        head = build_mtp_head(target, None)
    return sum(p.numel() * p.element_size() for p in head.parameters())
