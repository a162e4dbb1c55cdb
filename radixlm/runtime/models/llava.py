"""LLaVA (1.5): a CLIP or SigLIP vision tower (transformers' own module), a two-layer projector, and our Llama-family
language model on the paged KV cache. The image rows of a pass get their embeddings from `encode_items` (through the
executor's MultimodalEmbedder); everything after the embedding is the language model's."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable, Iterator

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.layers.linear import copy_checked
from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.mistral import MistralForCausalLM
from radixlm.runtime.models.qwen2 import Qwen2ForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.multimodal.inputs import MultimodalItem

logger = logging.getLogger(__name__)

LANGUAGE_MODELS: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM,
}
# Checkpoint name prefixes -> ours. llava-hf checkpoints use the first form; transformers 5 saves the second.
_PREFIXES = [
    ("model.language_model.", "language_model.model."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("lm_head.", "language_model.lm_head."),
]


def _activation(name: str) -> nn.Module:
    from transformers.activations import ACT2FN

    return ACT2FN[name]


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, act: str, bias: bool):
        super().__init__()
        self.linear_1 = nn.Linear(vision_hidden, text_hidden, bias=bias)
        self.act = _activation(act)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(nn.Module):
    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__()
        from transformers import AutoModel

        self.config = config
        text_config = config.text_config
        lm_cls = LANGUAGE_MODELS.get(text_config.model_type)
        if lm_cls is None:
            raise ValueError(f"LLaVA with a {text_config.model_type!r} language model is not supported; "
                             f"supported: {', '.join(sorted(LANGUAGE_MODELS))}")
        self.language_model = lm_cls(text_config, parallel)
        self.lm_head = self.language_model.lm_head
        self.vocab_size = text_config.vocab_size
        # The tower is replicated on every tensor-parallel rank (it is small beside the language model).
        self.vision_tower = AutoModel.from_config(config.vision_config, dtype=torch.get_default_dtype())
        layers = config.vision_feature_layer
        self.feature_layers = [layers] if isinstance(layers, int) else list(layers)
        self.drop_cls = config.vision_feature_select_strategy == "default"
        self.multi_modal_projector = LlavaMultiModalProjector(
            config.vision_config.hidden_size * len(self.feature_layers), text_config.hidden_size,
            config.projector_hidden_act, getattr(config, "multimodal_projector_bias", True))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.model.embed_tokens(input_ids)

    @torch.no_grad()
    def encode_items(self, items: list["MultimodalItem"]) -> list[torch.Tensor]:
        param = self.multi_modal_projector.linear_1.weight
        pixels = torch.cat([it.pixel_values.reshape(-1, *it.pixel_values.shape[-3:]) for it in items])
        out = self.vision_tower(pixels.to(param.device, param.dtype), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in self.feature_layers], dim=-1)
        if self.drop_cls:
            feats = feats[:, 1:]
        projected = self.multi_modal_projector(feats)
        return list(projected.reshape(len(items), -1, projected.shape[-1]).unbind(0))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch") -> torch.Tensor:
        return self.language_model(input_ids, positions, forward_batch)

    def _our_name(self, name: str, params: dict[str, nn.Parameter]) -> str:
        for theirs, ours in _PREFIXES:
            if name.startswith(theirs):
                name = ours + name[len(theirs):]
                break
        if name.startswith("vision_tower.") and name not in params:
            # transformers 4 nests the tower's weights under vision_model., transformers 5 does not.
            inner = name[len("vision_tower."):]
            alt = inner[len("vision_model."):] if inner.startswith("vision_model.") else "vision_model." + inner
            if "vision_tower." + alt in params:
                return "vision_tower." + alt
        return name

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        own = {n: p for n, p in params.items() if not n.startswith("language_model.")}
        loaded: set[str] = set()

        def language_weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, w in weights:
                ours = self._our_name(name, params)
                if ours.startswith("language_model."):
                    yield ours[len("language_model."):], w
                elif ours in own:
                    copy_checked(own[ours].data, w, name)
                    loaded.add(ours)
                elif not ours.endswith("position_ids"):
                    logger.warning("ignored unexpected checkpoint tensor %s", name)

        self.language_model.load_weights(language_weights())
        missing = sorted(set(own) - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing weights for {type(self).__name__}: {', '.join(missing[:8])}")
