"""Qwen2-VL and Qwen2.5-VL: transformers' own vision transformers (dynamic resolution: an image is as many 14-pixel
patches as its resized size holds, and 2x2 neighbours merge into one token) and our Qwen2 with multimodal rotary
positions (M-RoPE) on the paged KV cache. The front computes each prompt's three position rows
(MultimodalInputs.mrope); the planner hands the rows of a pass to the executor as ForwardBatch.mrope_positions."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.layers.mrope import MRotaryEmbedding
from radixlm.runtime.layers.rotary import rope_params_from_config
from radixlm.runtime.models.llama import head_dim_of
from radixlm.runtime.models.qwen2 import Qwen2ForCausalLM
from radixlm.runtime.models.vlm import VisionLanguageModel

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.multimodal.inputs import MultimodalItem


class Qwen2VLTextForCausalLM(Qwen2ForCausalLM):
    @staticmethod
    def build_rope(config: "PretrainedConfig") -> nn.Module:
        theta, params = rope_params_from_config(config)
        section = (params or {}).get("mrope_section")
        if section is None:
            raise ValueError("a Qwen2-VL text config needs rope_parameters.mrope_section")
        return MRotaryEmbedding(head_dim_of(config), config.max_position_embeddings, theta, section)


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    takes_rope_offsets = True  # decode rows: positions + ForwardBatch.rope_offsets (CUDA graphs keep a row for it)
    LANGUAGE_MODELS = {"qwen2_vl_text": Qwen2VLTextForCausalLM, "qwen2": Qwen2VLTextForCausalLM}
    # transformers 4 and original checkpoints: visual.*, model.* (the language model), lm_head; transformers 5 nests
    # both under model.
    PREFIXES = [
        ("model.visual.", "visual."),
        ("model.language_model.", "language_model.model."),
        ("visual.", "visual."),
        ("model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
    ]

    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__(config, parallel)
        self.visual = self._build_visual(config.vision_config)

    def _build_visual(self, vision_config) -> nn.Module:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        return Qwen2VisionTransformerPretrainedModel._from_config(vision_config, dtype=torch.get_default_dtype())

    @torch.no_grad()
    def encode_items(self, items: list["MultimodalItem"]) -> list[torch.Tensor]:
        param = next(self.visual.parameters())
        pixels = torch.cat([it.pixel_values for it in items]).to(param.device, param.dtype)
        grid = torch.tensor([it.grid_thw for it in items], dtype=torch.int64, device=param.device)
        merged = self.visual(pixels, grid_thw=grid).pooler_output
        return list(merged.split([it.num_tokens for it in items]))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch") -> torch.Tensor:
        # Prompt rows of requests with images carry three positions; rows past the prompts one and an offset; a
        # text-only pass the usual one (the same rotation).
        mrope, offsets = forward_batch.mrope_positions, forward_batch.rope_offsets
        if mrope is None and offsets is not None:
            mrope = positions + offsets
        return self.language_model(input_ids, positions if mrope is None else mrope, forward_batch)


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """Qwen2.5-VL: the same language model and image positions; a vision transformer with windowed attention."""

    LANGUAGE_MODELS = {"qwen2_5_vl_text": Qwen2VLTextForCausalLM, "qwen2": Qwen2VLTextForCausalLM}

    def _build_visual(self, vision_config) -> nn.Module:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

        return Qwen2_5_VisionTransformerPretrainedModel._from_config(vision_config, dtype=torch.get_default_dtype())
