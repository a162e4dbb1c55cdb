"""Encoders for pooled outputs (--is-embedding): BERT and XLM-RoBERTa, as embedding models and, as
`*ForSequenceClassification`, cross-encoders whose scores rerank documents.

Every row attends to all rows of its own prompt (no causal mask), so a pass holds each prompt whole (the scheduler
neither chunks embedding prompts nor, for a model that is not causal, reuses a cached prefix). The KV pool is not
written. Module names follow the Hugging Face checkpoints', so weights load by name."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.layers.linear import copy_checked

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch

# Checkpoint tensors the encoder does not use: buffers, and the heads of pre-training.
_IGNORED = ("embeddings.position_ids", "embeddings.token_type_ids", "cls.", "lm_head.")


def _activation(name: str):
    from transformers.activations import ACT2FN

    if name not in ACT2FN:
        raise ValueError(f"unsupported hidden_act {name!r}")
    return ACT2FN[name]


class EncoderLayer(nn.Module):
    def __init__(self, config: "PretrainedConfig"):
        super().__init__()
        h, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.attention = nn.ModuleDict({
            "self": nn.ModuleDict({"query": nn.Linear(h, h), "key": nn.Linear(h, h), "value": nn.Linear(h, h)}),
            "output": nn.ModuleDict({"dense": nn.Linear(h, h), "LayerNorm": nn.LayerNorm(h, eps=eps)}),
        })
        self.intermediate = nn.ModuleDict({"dense": nn.Linear(h, config.intermediate_size)})
        self.output = nn.ModuleDict({"dense": nn.Linear(config.intermediate_size, h),
                                     "LayerNorm": nn.LayerNorm(h, eps=eps)})
        self.act = _activation(config.hidden_act)

    def forward(self, x: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
        qkv = self.attention["self"]
        t = x.shape[0]
        q, k, v = (qkv[n](x).view(t, self.num_heads, self.head_dim).transpose(0, 1) for n in ("query", "key", "value"))
        # Each prompt attends within itself only: one attention call per prompt of the pass.
        ctx = torch.cat([F.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b]) for a, b in spans], dim=1)
        out = self.attention["output"]
        x = out["LayerNorm"](out["dense"](ctx.transpose(0, 1).reshape(t, -1)) + x)
        ff = self.output["dense"](self.act(self.intermediate["dense"](x)))
        return self.output["LayerNorm"](ff + x)


class EncoderModel(nn.Module):
    """BertModel / XLMRobertaModel: embeddings (token, position, token type), then the layers."""

    def __init__(self, config: "PretrainedConfig", position_offset: int):
        super().__init__()
        h = config.hidden_size
        self.position_offset = position_offset  # RoBERTa's positions start after its padding index
        self.embeddings = nn.ModuleDict({
            "word_embeddings": nn.Embedding(config.vocab_size, h),
            "position_embeddings": nn.Embedding(config.max_position_embeddings, h),
            "token_type_embeddings": nn.Embedding(config.type_vocab_size, h),
            "LayerNorm": nn.LayerNorm(h, eps=config.layer_norm_eps),
        })
        layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_hidden_layers))
        self.encoder = nn.ModuleDict({"layer": layers})

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch") -> torch.Tensor:
        spans = _prompt_spans(forward_batch)
        emb = self.embeddings
        types = forward_batch.token_type_ids
        if types is None:
            types = torch.zeros_like(input_ids)
        x = (emb["word_embeddings"](input_ids) + emb["position_embeddings"](positions + self.position_offset)
             + emb["token_type_embeddings"](types))
        x = emb["LayerNorm"](x)
        for layer in self.encoder["layer"]:
            x = layer(x, spans)
        return x


def _prompt_spans(fb: "ForwardBatch") -> list[tuple[int, int]]:
    """Each request's rows [a, b) in the pass; each must be its whole prompt."""
    if any(fb.extend_prefix_lens_cpu):
        raise ValueError("an encoder computes each prompt whole in one pass (no cached prefix, no chunks)")
    lens = fb.extend_seq_lens_cpu if fb.forward_mode.is_request_spans() else [1] * fb.num_tokens
    spans, a = [], 0
    for n in lens:
        spans.append((a, a + n))
        a += n
    return spans


class BertModel(nn.Module):
    """An encoder whose pooled output is an embedding (PoolingConfig: CLS or mean, normalized)."""

    is_causal = False
    base_prefix = "bert."  # the encoder's name inside a *ForSequenceClassification checkpoint

    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__()
        if parallel.tp_size > 1:
            raise ValueError(f"{type(self).__name__} runs with tp_size 1 only")
        self.config = config
        self.encoder_model = EncoderModel(config, self.position_offset(config))
        # The runner's logits processor needs a head; an embedding pass never computes logits.
        self.lm_head = self.encoder_model.embeddings["word_embeddings"]

    @staticmethod
    def position_offset(config: "PretrainedConfig") -> int:
        return 0

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch") -> torch.Tensor:
        return self.encoder_model(input_ids, positions, forward_batch)

    def map_weight_name(self, name: str) -> str | None:
        """A checkpoint tensor's name -> our parameter's (None: not used)."""
        if name.startswith(self.base_prefix):
            name = name[len(self.base_prefix):]
        if name.startswith(_IGNORED) or name.startswith("pooler."):
            return None
        return f"encoder_model.{name}"

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            target = self.map_weight_name(name)
            if target is None:
                continue
            # Older checkpoints name LayerNorm parameters gamma / beta.
            target = target.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
            if target not in params:
                raise ValueError(f"unexpected checkpoint tensor {name}")
            copy_checked(params[target].data, w, name)
            loaded.add(target)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing weights for {type(self).__name__}: {', '.join(missing[:8])}")


class BertForSequenceClassification(BertModel):
    """A cross-encoder: the [CLS] row through BERT's pooler (dense, tanh) and the classifier gives its scores."""

    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__(config, parallel)
        h = config.hidden_size
        self.pooler = nn.ModuleDict({"dense": nn.Linear(h, h)})
        self.classifier = nn.Linear(h, config.num_labels)

    def map_weight_name(self, name: str) -> str | None:
        if name.startswith(("classifier.", "bert.pooler.", "pooler.")):
            return name.removeprefix("bert.")
        return super().map_weight_name(name)

    def classify(self, cls_rows: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler["dense"](cls_rows)))


class XLMRobertaModel(BertModel):
    base_prefix = "roberta."

    @staticmethod
    def position_offset(config: "PretrainedConfig") -> int:
        return config.pad_token_id + 1


class XLMRobertaForSequenceClassification(XLMRobertaModel):
    """RoBERTa's classification head: dense, tanh, out_proj over the [CLS] (<s>) row."""

    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__(config, parallel)
        h = config.hidden_size
        self.classifier = nn.ModuleDict({"dense": nn.Linear(h, h), "out_proj": nn.Linear(h, config.num_labels)})

    def map_weight_name(self, name: str) -> str | None:
        if name.startswith("classifier."):
            return name
        return super().map_weight_name(name)

    def classify(self, cls_rows: torch.Tensor) -> torch.Tensor:
        return self.classifier["out_proj"](torch.tanh(self.classifier["dense"](cls_rows)))
