"""Hugging Face architecture name -> model class."""
from __future__ import annotations

from torch import nn

from radixlm.runtime.models.bert import (
    BertForSequenceClassification, BertModel, XLMRobertaForSequenceClassification, XLMRobertaModel,
)
from radixlm.runtime.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.llava import LlavaForConditionalGeneration
from radixlm.runtime.models.llava_next import LlavaNextForConditionalGeneration, LlavaOnevisionForConditionalGeneration
from radixlm.runtime.models.mistral import MistralForCausalLM
from radixlm.runtime.models.mixtral import MixtralForCausalLM
from radixlm.runtime.models.qwen2 import Qwen2ForCausalLM
from radixlm.runtime.models.qwen2_vl import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration
from radixlm.runtime.models.qwen3 import Qwen3ForCausalLM
from radixlm.runtime.models.qwen_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "BertModel": BertModel,
    "BertForSequenceClassification": BertForSequenceClassification,
    "XLMRobertaModel": XLMRobertaModel,
    "XLMRobertaForSequenceClassification": XLMRobertaForSequenceClassification,
    # A decoder's backbone without its head (e.g. saved by AutoModel): served with --is-embedding.
    "LlamaModel": LlamaForCausalLM,
    "Qwen2Model": Qwen2ForCausalLM,
    "Qwen3Model": Qwen3ForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
    "LlavaNextForConditionalGeneration": LlavaNextForConditionalGeneration,
    "LlavaOnevisionForConditionalGeneration": LlavaOnevisionForConditionalGeneration,
    "MistralForCausalLM": MistralForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
}


def get_model_class(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        supported = ", ".join(sorted(MODEL_REGISTRY))
        raise ValueError(f"unsupported model architecture {architecture!r}; supported: {supported}") from None


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)
