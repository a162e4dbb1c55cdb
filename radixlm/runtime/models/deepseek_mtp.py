"""DeepSeek-V3's multi-token-prediction (MTP, "next-n") module as an EAGLE-style draft head (SGLang's DeepSeek NextN).

The checkpoint holds it as one more layer, model.layers.{num_hidden_layers} (num_nextn_predict_layers = 1): `enorm`
and `hnorm` (RMSNorms), `eh_proj` (2h -> h, no bias), one decoder layer (MLA, and MoE or a dense MLP as its index
says: first_k_dense_replace, moe_layer_freq), `shared_head.norm`, and copies of the target's `embed_tokens` and
`lm_head` (`shared_head.head`), which are not loaded: the head uses the target's own.

At position i it reads the embedding of token t_{i+1} and the target's final hidden state h_i (the lm_head input),
as an EAGLE-1 head does: x = eh_proj([enorm(embed(t_{i+1})) | hnorm(h_i)]) (this order, SGLang's and vLLM's), then
the decoder layer over its own latent KV, then shared_head.norm; the output is the head's guess of h_{i+1}, which the
target's lm_head turns into a guess of t_{i+2}, and which a draft chain feeds back as the next step's feature."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.norm import RMSNorm
from radixlm.runtime.models.deepseek_v2 import _MLP_STACKED, _Q_LORA_STACKED, DeepseekV2ForCausalLM
from radixlm.runtime.models.llama import LlamaForCausalLM, LoadReport

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch

# The head's own tensors (names under the MTP layer); the rest of that layer is its decoder layer.
HEAD_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")
# Copies of the target's tensors in the MTP layer: the target's own are used.
SHARED_WITH_TARGET = ("embed_tokens.weight", "shared_head.head.weight")
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")


def num_mtp_layers(config: "PretrainedConfig") -> int:
    """The checkpoint's MTP layers (num_nextn_predict_layers; 0 for models without them)."""
    n = getattr(config, "num_nextn_predict_layers", None) or 0
    if n < 0:
        raise ValueError(f"num_nextn_predict_layers must be >= 0, got {n}")
    return int(n)


def mtp_tensor_name(name: str, num_hidden_layers: int) -> str | None:
    """A checkpoint tensor's name relative to the first MTP layer (model.layers.{num_hidden_layers}.X -> X), or None
    for any other tensor."""
    m = _LAYER.match(name)
    if m is None or int(m.group(1)) != num_hidden_layers:
        return None
    return m.group(2)


class _SharedHead(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(hidden_size, eps)


class DeepseekMTPHead(nn.Module):
    tie_word_embeddings = False  # LlamaForCausalLM.load_weights reads it; the head has no lm_head of its own
    # Loading as the target does: DeepSeek's names (experts, the fused q_a / kv_a GEMM, gate_up), then Llama's loop.
    map_weight_name = DeepseekV2ForCausalLM.map_weight_name
    _checkpoint_name = DeepseekV2ForCausalLM._checkpoint_name
    _missing = LlamaForCausalLM._missing
    _load = LlamaForCausalLM.load_weights

    def __init__(self, config: "PretrainedConfig", embed_tokens: nn.Module,
                 target_cls: type[DeepseekV2ForCausalLM] = DeepseekV2ForCausalLM):
        super().__init__()
        if num_mtp_layers(config) < 1:
            raise ValueError("the checkpoint has no multi-token-prediction layer (num_nextn_predict_layers is 0)")
        h, eps = config.hidden_size, config.rms_norm_eps
        self.config = config
        self._embed = [embed_tokens]  # the target's (not registered: neither loaded nor packed again here)
        self.enorm = RMSNorm(h, eps)
        self.hnorm = RMSNorm(h, eps)
        self.eh_proj = Linear(2 * h, h, bias=False)
        # The checkpoint's layer num_hidden_layers (dense or MoE by that index), its latent cache at the head's own
        # pool layer 0; the target's routing rule (V3: sigmoid, noaux_tc).
        self.decoder = target_cls.layer_builder(config)(config.num_hidden_layers, 0, SINGLE)
        self.shared_head = _SharedHead(h, eps)
        self._stacked = (_Q_LORA_STACKED if getattr(config, "q_lora_rank", None) is not None else []) + _MLP_STACKED

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch",
                features: torch.Tensor) -> torch.Tensor:
        """Row r: the embedding of input_ids[r] (t_{i+1}) and features[r] (h_i, or the head's previous output) at
        positions[r] (i); returns the head's outputs (guesses of h_{i+1}, normed as the target's final states)."""
        x = torch.cat([self.enorm(self._embed[0](input_ids)), self.hnorm(features.to(self.enorm.weight.dtype))], -1)
        hidden, residual = self.decoder(positions, self.eh_proj(x), forward_batch, None)
        out, _ = self.shared_head.norm(hidden, residual)
        return out

    @property
    def feature_weight(self) -> torch.Tensor:
        """A parameter in the features' dtype and device (CUDA-graph feature buffers follow it)."""
        return self.eh_proj.weight

    def draft_tokens(self, out: torch.Tensor, target_logits) -> torch.Tensor:
        return torch.argmax(target_logits(out), dim=-1)

    def draft_topk(self, out: torch.Tensor, target_logits, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities, tokens) of each row's k likeliest next tokens, best first (tree drafts)."""
        return torch.log_softmax(target_logits(out).float(), dim=-1).topk(k, dim=-1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> LoadReport:
        """The target checkpoint's tensors (all of them: those of the MTP layer are picked here)."""
        return self._load(self._own(weights))

    def _own(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
        for name, w in weights:
            rel = mtp_tensor_name(name, self.config.num_hidden_layers)
            if rel is None or rel in SHARED_WITH_TARGET:
                continue
            yield (rel if rel.startswith(HEAD_OWN) else f"decoder.{rel}"), w
