"""ModelConfig: everything the runtime needs to know about a model before building it."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.model_loader.files import ModelLoadError, resolve_model_path
from radixlm.runtime.model_loader.gguf import convert_gguf, find_gguf
from radixlm.runtime.quantization import QuantConfig, quant_config_from

if TYPE_CHECKING:
    from transformers import PretrainedConfig


LOAD_FORMATS = ("auto", "safetensors", "dummy")
ROBERTA_TYPES = ("roberta", "xlm-roberta")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "half": torch.float16,
           "float": torch.float32}


def resolve_model_dir(path: str, with_tensors: bool = True) -> str:
    """Alias, GGUF file or HF directory -> an HF directory (converting a GGUF once, cached; with_tensors=False: its
    config and tokenizer only, gguf.convert_gguf)."""
    resolved = resolve_model_path(path)
    gguf_file = find_gguf(resolved)
    if gguf_file is not None:
        return convert_gguf(gguf_file, with_tensors)
    if not os.path.isfile(os.path.join(resolved, "config.json")):
        raise ModelLoadError(f"model directory {resolved} has no config.json (and no GGUF file)")
    return resolved


def _config_dtype(hf_config) -> torch.dtype | None:
    d = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(d, str):
        d = _DTYPES.get(d)
    return d if isinstance(d, torch.dtype) else None


def resolve_dtype(dtype: str | torch.dtype, hf_config, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
        return _DTYPES[dtype]
    if torch.device(device).type == "cpu":
        return torch.float32
    # On an accelerator, a float32 (or unstated) checkpoint runs in bfloat16: float32 is never what serving wants.
    cfg = _config_dtype(hf_config)
    return cfg if cfg in (torch.bfloat16, torch.float16) else torch.bfloat16


def _derived_context_len(hf_config) -> int:
    for key in ("max_position_embeddings", "max_sequence_length", "seq_length", "max_seq_len"):
        v = getattr(hf_config, key, None)
        if v:
            # RoBERTa's position table starts after its padding index.
            offset = hf_config.pad_token_id + 1 if getattr(hf_config, "model_type", "") in ROBERTA_TYPES else 0
            return int(v) - offset
    return 2048


def _eos_token_ids(hf_config, model_path: str) -> frozenset[int]:
    ids: set[int] = set()

    def add(v) -> None:
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)

    add(getattr(hf_config, "eos_token_id", None))
    gen_path = os.path.join(model_path, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            add(json.load(f).get("eos_token_id"))
    return frozenset(ids)


@dataclass(frozen=True)
class MLADims:
    """Multi-head latent attention's sizes (DeepSeek-V2/V3): the KV cache holds kv_lora_rank + qk_rope_head_dim
    values per token per layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (rotated in pairs), got {self.qk_rope_head_dim}")
        if self.q_lora_rank is not None and self.q_lora_rank < 1:
            raise ValueError(f"q_lora_rank must be at least 1 or None, got {self.q_lora_rank}")

    @classmethod
    def from_config(cls, config) -> "MLADims | None":
        """From a transformers config that has kv_lora_rank (DeepseekV2Config, DeepseekV3Config), else None."""
        if getattr(config, "kv_lora_rank", None) is None:
            return None
        return cls(int(config.kv_lora_rank), int(config.qk_rope_head_dim), int(config.qk_nope_head_dim),
                   int(config.v_head_dim), getattr(config, "q_lora_rank", None))


@dataclass
class ModelConfig:
    model_path: str  # the resolved HF directory
    hf_config: "PretrainedConfig"
    architecture: str
    dtype: torch.dtype
    context_len: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    # From the checkpoint's quantization_config and the --quantization flag (None: float).
    quant_config: QuantConfig | None = None
    is_embedding: bool = False  # served for pooled outputs: a decoder's lm_head is neither loaded nor used
    mla: MLADims | None = None  # multi-head latent attention: a latent KV pool (num_kv_heads is then 1)

    @classmethod
    def from_path(
        cls,
        path: str,
        dtype: str | torch.dtype = "auto",
        device: str = "cpu",
        context_length: int | None = None,
        load_format: str = "auto",
        quantization: str | None = None,
        is_embedding: bool = False,
    ) -> "ModelConfig":
        from transformers import AutoConfig

        from radixlm.runtime.models.registry import get_model_class

        if load_format not in LOAD_FORMATS:
            raise ValueError(f"unknown load_format {load_format!r}; use one of {', '.join(LOAD_FORMATS)}")
        model_dir = resolve_model_dir(path)
        try:
            hf_config = AutoConfig.from_pretrained(model_dir)
        except Exception as e:
            raise ModelLoadError(f"cannot read {os.path.join(model_dir, 'config.json')}: {e}") from e
        archs = getattr(hf_config, "architectures", None) or []
        if not archs:
            raise ModelLoadError(f"{model_dir}/config.json names no architecture")
        try:
            get_model_class(archs[0])
        except ValueError as e:
            raise ModelLoadError(f"{model_dir}: {e}") from None

        # A multimodal config keeps the language model's fields in its text config.
        text_config = hf_config.get_text_config()
        derived = _derived_context_len(text_config)
        context_len = derived
        if context_length is not None:
            if context_length > derived:
                raise ValueError(
                    f"context_length {context_length} exceeds the model's max_position_embeddings {derived}"
                )
            context_len = context_length
        try:
            quant_config = quant_config_from(hf_config, quantization, model_dir)
        except ValueError as e:
            raise ModelLoadError(f"{model_dir}: {e}") from None
        tc = text_config
        num_heads = tc.num_attention_heads
        try:
            mla = MLADims.from_config(tc)
        except ValueError as e:
            raise ModelLoadError(f"{model_dir}: {e}") from None
        return cls(
            model_path=model_dir,
            hf_config=hf_config,
            architecture=archs[0],
            dtype=resolve_dtype(dtype, hf_config, device),
            context_len=context_len,
            num_layers=tc.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=1 if mla is not None else getattr(tc, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // num_heads,
            hidden_size=tc.hidden_size,
            vocab_size=tc.vocab_size,
            eos_token_ids=_eos_token_ids(hf_config, model_dir) | _eos_token_ids(tc, model_dir),
            quant_config=quant_config,
            is_embedding=is_embedding,
            mla=mla,
        )
