"""EAGLE draft head (Li et al., 2024; EAGLE-1/2 layout) over a Llama-family target: `fc` (2h -> h, its bias
optional), one decoder layer `layers.0.*` without an input norm, and the target's embeddings and lm_head (a
checkpoint's own copies of those are not used).

The head continues the target's feature sequence: at position i it reads the embedding of token t_{i+1} and the
target's final hidden state h_i (the lm_head input), and outputs its guess of h_{i+1}, which the target's lm_head
turns into a guess of t_{i+2}; a draft chain feeds its own output back as the next feature."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.layers.linear import Linear, copy_checked
from radixlm.runtime.layers.rotary import get_rope, rope_params_from_config
from radixlm.runtime.models.llama import STACKED_PARAMS, LlamaDecoderLayer, LlamaMLP, head_dim_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

SHARED_WITH_TARGET = ("embed_tokens.weight", "lm_head.weight")


class _NoNorm(nn.Module):
    """EAGLE's first (only) layer takes fc's output without an input norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class EagleHead(nn.Module):
    def __init__(self, config: "PretrainedConfig", embed_tokens: nn.Module):
        super().__init__()
        h = config.hidden_size
        self._embed = [embed_tokens]  # the target's (not registered: neither loaded nor packed again here)
        self.fc = Linear(2 * h, h, bias=True)
        theta, scaling = rope_params_from_config(config)
        rope = get_rope(head_dim_of(config), config.max_position_embeddings, theta, scaling)
        bias = bool(getattr(config, "attention_bias", False))
        mlp = LlamaMLP(h, config.intermediate_size, getattr(config, "mlp_bias", False), SINGLE)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0, rope, bias, bias, False, mlp, SINGLE)])
        self.layers[0].input_layernorm = _NoNorm()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch",
                features: torch.Tensor) -> torch.Tensor:
        """Row r: the embedding of input_ids[r] (t_{i+1}) and features[r] (h_i) at positions[r] (i); returns the
        head's outputs (guesses of h_{i+1})."""
        x = self.fc(torch.cat([self._embed[0](input_ids), features.to(self.fc.weight.dtype)], dim=-1))
        out, residual = self.layers[0](positions, x, forward_batch, None)
        return out + residual

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded: set[tuple[str, object]] = set()
        for name, w in weights:
            if name.startswith("model."):  # some exports nest the head under `model.`
                name = name[len("model."):]
            if name in SHARED_WITH_TARGET:
                continue
            target, shard_id = name, None
            for hf_frag, our_frag, sid in STACKED_PARAMS:
                if hf_frag in name:
                    target, shard_id = name.replace(hf_frag, our_frag), sid
                    break
            param = params.get(target)
            if param is None:
                logger.warning("EAGLE head: ignored checkpoint tensor %s", name)
                continue
            module_name, pname = target.rsplit(".", 1)
            module = self.get_submodule(module_name)
            if hasattr(module, "load_weight"):
                module.load_weight(pname, param, w, shard_id)
            else:
                copy_checked(param.data, w, name)
            loaded.add((target, shard_id))
        if ("fc.bias", None) not in loaded:
            self.fc.bias.zero_()  # a checkpoint without fc.bias: a bias-free fc
            loaded.add(("fc.bias", None))
        missing = []
        for target in params:
            module = self.get_submodule(target.rsplit(".", 1)[0])
            shards = module.weight_shards(target.rsplit(".", 1)[1]) if hasattr(module, "weight_shards") else [None]
            missing += [target for s in shards if (target, s) not in loaded]
        if missing:
            raise ValueError(f"EAGLE head checkpoint is missing {sorted(set(missing))}")
