"""EAGLE draft heads (Li et al.) over a Llama-family target, in their published checkpoint layouts.

EAGLE-1/2 (EagleHead): `fc` (2h -> h, its bias optional), one decoder layer `layers.0.*` without an input norm, and
the target's embeddings and lm_head (a checkpoint's own copies of those are not used). At position i it reads the
embedding of token t_{i+1} and the target's final hidden state h_i (the lm_head input), and outputs its guess of
h_{i+1}, which the target's lm_head turns into a guess of t_{i+2}; a draft chain feeds its own output back.

EAGLE-3 (Eagle3Head): the feature is three of the target's layers' hidden states (`fc`: 3h -> h, no bias); the one
layer `midlayer.*` normalizes the embedding (input_layernorm) and the feature (hidden_norm) and attends over both
(q, k, v from 2h); its output goes through its own `norm` and `lm_head` over a smaller draft vocabulary, whose ids
map to the target's by `d2t` (target id = draft id + d2t[draft id])."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.layers.linear import ColumnParallelLinear, Linear, VocabEmbedding, copy_checked
from radixlm.runtime.layers.norm import RMSNorm
from radixlm.runtime.layers.rotary import get_rope, rope_params_from_config
from radixlm.runtime.models.llama import STACKED_PARAMS, LlamaAttention, LlamaDecoderLayer, LlamaMLP, head_dim_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

SHARED_WITH_TARGET = ("embed_tokens.weight", "lm_head.weight")


class _NoNorm(nn.Module):
    """EAGLE's first (only) layer takes fc's output without an input norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def prologue(self, residual: torch.Tensor | None = None, reduce=None) -> None:
        assert residual is None and reduce is None, "the EAGLE head's only layer starts the residual stream"
        return None


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

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_head_weights(self, weights)

    @property
    def feature_weight(self) -> torch.Tensor:
        """A parameter in the features' dtype and device (CUDA-graph feature buffers follow it)."""
        return self.fc.weight

    def draft_tokens(self, out: torch.Tensor, target_logits) -> torch.Tensor:
        return torch.argmax(target_logits(out), dim=-1)

    def draft_topk(self, out: torch.Tensor, target_logits, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities, tokens) of each row's k likeliest next tokens, best first (tree drafts)."""
        return torch.log_softmax(target_logits(out).float(), dim=-1).topk(k, dim=-1)


class Eagle3Head(nn.Module):
    def __init__(self, config: "PretrainedConfig", embed_tokens: nn.Module, target_hidden: int):
        super().__init__()
        h = config.hidden_size
        self._embed = [embed_tokens]
        self.fc = Linear(3 * target_hidden, h, bias=False)
        theta, scaling = rope_params_from_config(config)
        rope = get_rope(head_dim_of(config), config.max_position_embeddings, theta, scaling)
        self.midlayer = nn.Module()
        attn = LlamaAttention(config, 0, rope, False, False, False, SINGLE)
        attn.qkv_proj = ColumnParallelLinear(2 * h, attn.qkv_proj.shards)  # over [embedding, feature]
        self.midlayer.self_attn = attn
        self.midlayer.mlp = LlamaMLP(h, config.intermediate_size, False, SINGLE)
        self.midlayer.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.midlayer.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.midlayer.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.draft_vocab_size = getattr(config, "draft_vocab_size", None) or config.vocab_size
        self.lm_head = VocabEmbedding(self.draft_vocab_size, h, SINGLE)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.int64))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch",
                features: torch.Tensor) -> torch.Tensor:
        """features: the target's three layers' states (3h, projected by fc) or the head's own outputs (h)."""
        layer = self.midlayer
        hidden = features.to(self.fc.weight.dtype)
        if hidden.shape[-1] != self.fc.out_features:
            hidden = self.fc(hidden)
        x = torch.cat([layer.input_layernorm(self._embed[0](input_ids)), layer.hidden_norm(hidden)], dim=-1)
        attn = layer.self_attn(positions, x, forward_batch)
        normed, residual = layer.post_attention_layernorm(attn, hidden)
        return layer.mlp(normed) + residual

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_head_weights(self, ((n, w) for n, w in weights if n != "t2d"))

    feature_weight = EagleHead.feature_weight

    def draft_tokens(self, out: torch.Tensor, target_logits) -> torch.Tensor:
        logits = torch.nn.functional.linear(self.norm(out), self.lm_head.weight)
        d = torch.argmax(logits.float(), dim=-1)
        return d + self.d2t[d]

    def draft_topk(self, out: torch.Tensor, target_logits, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities, tokens) of each row's k likeliest next tokens over the draft vocabulary, best first."""
        logits = torch.nn.functional.linear(self.norm(out), self.lm_head.weight)
        logp, d = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
        return logp, d + self.d2t[d]


@torch.no_grad()
def load_head_weights(head: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """A head's checkpoint tensors; the target's embeddings (and, for EAGLE-1, its lm_head) are not the head's."""
    params = dict(head.named_parameters())
    if hasattr(head, "d2t"):
        params["d2t"] = head.d2t
    own = set(params)
    loaded: set[tuple[str, object]] = set()
    for name, w in weights:
        if name.startswith("model."):  # some exports nest the head under `model.`
            name = name[len("model."):]
        if name in SHARED_WITH_TARGET and name not in own:
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
        module_name, pname = target.rsplit(".", 1) if "." in target else ("", target)
        module = head.get_submodule(module_name) if module_name else head
        if hasattr(module, "load_weight"):
            module.load_weight(pname, param, w, shard_id)
        else:
            copy_checked(param.data, w, name)
        loaded.add((target, shard_id))
    fc = getattr(head, "fc", None)
    if fc is not None and fc.bias is not None and ("fc.bias", None) not in loaded:
        fc.bias.zero_()  # a checkpoint without fc.bias: a bias-free fc
        loaded.add(("fc.bias", None))
    missing = []
    for target in params:
        module_name, pname = target.rsplit(".", 1) if "." in target else ("", target)
        module = head.get_submodule(module_name) if module_name else head
        shards = module.weight_shards(pname) if hasattr(module, "weight_shards") else [None]
        missing += [target for s in shards if (target, s) not in loaded]
    if missing:
        raise ValueError(f"EAGLE head checkpoint is missing {sorted(set(missing))}")
