"""LLaVA (1.5): a CLIP or SigLIP vision tower (transformers' own module), a two-layer projector, and our Llama-family
language model on the paged KV cache. The image rows of a pass get their embeddings from `encode_items` (through the
executor's MultimodalEmbedder); everything after the embedding is the language model's."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.models.vlm import VisionLanguageModel

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.multimodal.inputs import MultimodalItem


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


class LlavaForConditionalGeneration(VisionLanguageModel):
    # llava-hf checkpoints use our names; transformers 5 saves these.
    PREFIXES = [
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("lm_head.", "language_model.lm_head."),
    ]

    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__(config, parallel)
        from transformers import AutoModel

        # The tower is replicated on every tensor-parallel rank (it is small beside the language model).
        self.vision_tower = AutoModel.from_config(config.vision_config, dtype=torch.get_default_dtype())
        layers = config.vision_feature_layer
        self.feature_layers = [layers] if isinstance(layers, int) else list(layers)
        self.drop_cls = config.vision_feature_select_strategy == "default"
        self.multi_modal_projector = LlavaMultiModalProjector(
            config.vision_config.hidden_size * len(self.feature_layers), config.text_config.hidden_size,
            config.projector_hidden_act, getattr(config, "multimodal_projector_bias", True))

    def _features(self, views: torch.Tensor) -> torch.Tensor:
        """(views, 3, H, W) -> (views, tokens per view, hidden): the selected tower layers, projected."""
        param = self.multi_modal_projector.linear_1.weight
        out = self.vision_tower(views.to(param.device, param.dtype), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in self.feature_layers], dim=-1)
        return self.multi_modal_projector(feats[:, 1:] if self.drop_cls else feats)

    @torch.no_grad()
    def encode_items(self, items: list["MultimodalItem"]) -> list[torch.Tensor]:
        views = torch.cat([it.pixel_values.reshape(-1, *it.pixel_values.shape[-3:]) for it in items])
        projected = self._features(views)
        return list(projected.reshape(len(items), -1, projected.shape[-1]).unbind(0))

    def _our_name(self, name: str, params: dict[str, nn.Parameter]) -> str:
        name = super()._our_name(name, params)
        if name.startswith("vision_tower.") and name not in params:
            # transformers 4 nests the tower's weights under vision_model., transformers 5 does not.
            inner = name[len("vision_tower."):]
            alt = inner[len("vision_model."):] if inner.startswith("vision_model.") else "vision_model." + inner
            if "vision_tower." + alt in params:
                return "vision_tower." + alt
        return name
