"""What the vision-language models share: our language model built from the config's text config (so it runs on the
paged KV cache), the token embedding the executor's MultimodalEmbedder calls, and checkpoint loading that routes the
language model's weights to its own loader. A subclass adds its encoder (`encode_items`) and its name mapping."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable, Iterator

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.layers.linear import copy_checked
from radixlm.runtime.models.llama import LlamaForCausalLM, LoadReport
from radixlm.runtime.models.mistral import MistralForCausalLM
from radixlm.runtime.models.qwen2 import Qwen2ForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch
    from radixlm.runtime.multimodal.inputs import MultimodalItem

logger = logging.getLogger(__name__)


class VisionLanguageModel(nn.Module):
    # text config model_type -> our language model
    LANGUAGE_MODELS: dict[str, type[LlamaForCausalLM]] = {
        "llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM,
    }
    # Checkpoint name prefixes -> ours (first match wins).
    PREFIXES: list[tuple[str, str]] = []

    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__()
        self.config = config
        text_config = config.get_text_config()
        lm_cls = self.LANGUAGE_MODELS.get(text_config.model_type)
        if lm_cls is None:
            raise ValueError(f"{type(self).__name__} with a {text_config.model_type!r} language model is not supported; "
                             f"supported: {', '.join(sorted(self.LANGUAGE_MODELS))}")
        self.language_model = lm_cls(text_config, parallel)
        self.lm_head = self.language_model.lm_head
        self.vocab_size = text_config.vocab_size

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.model.embed_tokens(input_ids)

    def encode_items(self, items: list["MultimodalItem"]) -> list[torch.Tensor]:
        """One (num_tokens, hidden_size) tensor per item."""
        raise NotImplementedError

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch") -> torch.Tensor:
        return self.language_model(input_ids, positions, forward_batch)

    def _our_name(self, name: str, params: dict[str, nn.Parameter]) -> str:
        for theirs, ours in self.PREFIXES:
            if name.startswith(theirs):
                return ours + name[len(theirs):]
        return name

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], require_all: bool = True) -> LoadReport:
        params = dict(self.named_parameters())
        own = {n: p for n, p in params.items() if not n.startswith("language_model.")}
        loaded: set[str] = set()
        unexpected: list[str] = []

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
                    unexpected.append(name)

        report = self.language_model.load_weights(language_weights(), require_all)
        missing = sorted(set(own) - loaded) if require_all else []
        if missing:
            raise ValueError(f"checkpoint is missing weights for {type(self).__name__}: {', '.join(missing[:8])}")
        return LoadReport({(f"language_model.{t}", s) for t, s in report.loaded} | {(n, None) for n in loaded},
                          unexpected + report.unexpected)
