"""Mistral: the Llama architecture. Sliding-window attention (Mistral 7B v0.1) is not applied, which
only matters past the window; we warn rather than refuse."""
from __future__ import annotations

import logging

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)


class MistralForCausalLM(LlamaForCausalLM):
    def __init__(self, config, parallel: Parallel = SINGLE):
        super().__init__(config, parallel)
        window = getattr(config, "sliding_window", None)
        if window and window < config.max_position_embeddings:
            logger.warning(
                "sliding_window=%d is not implemented: sequences longer than it attend to the full prefix", window
            )
