"""Pooled outputs (--is-embedding): a prompt's last hidden states reduced to one vector (last token, mean, CLS),
normalized as the model's configuration says, or a sequence classifier's scores (cross-encoders).

The configuration comes from sentence-transformers' files where the checkpoint has them (modules.json naming a
Pooling module and its config.json, and a Normalize module); otherwise SGLang's defaults: a decoder pools its last
token, an encoder its first ([CLS]), both normalized; a `*ForSequenceClassification` model returns its scores."""
from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
# sentence-transformers' Pooling config keys that radixlm computes, and the mode each sets.
_MODE_KEYS = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
_UNSUPPORTED_KEYS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")


class PoolingType(str, enum.Enum):
    LAST = "last"
    MEAN = "mean"
    CLS = "cls"


@dataclass(frozen=True)
class PoolingConfig:
    pooling: PoolingType
    normalize: bool

    @property
    def needs_whole_prompt(self) -> bool:
        """Whether every prompt row's hidden state is read (no cached prefix can stand in for them)."""
        return self.pooling is not PoolingType.LAST

    @classmethod
    def from_model_dir(cls, model_dir: str, causal: bool) -> "PoolingConfig":
        default = cls(PoolingType.LAST if causal else PoolingType.CLS, True)
        modules = _read_json(os.path.join(model_dir, "modules.json"))
        if not isinstance(modules, list):
            return default
        types = {m.get("type"): m for m in modules if isinstance(m, dict)}
        pooling = types.get(POOLING_MODULE)
        if pooling is None:
            return cls(default.pooling, NORMALIZE_MODULE in types)
        conf = _read_json(os.path.join(model_dir, pooling.get("path") or "", "config.json")) or {}
        bad = [k for k in _UNSUPPORTED_KEYS if conf.get(k)]
        modes = [mode for key, mode in _MODE_KEYS.items() if conf.get(key)]
        if bad or len(modes) > 1:
            raise ValueError(f"{model_dir}: unsupported sentence-transformers pooling {bad + modes} "
                             f"(radixlm pools one of: {', '.join(_MODE_KEYS.values())})")
        return cls(PoolingType(modes[0]) if modes else default.pooling, NORMALIZE_MODULE in types)


def _read_json(path: str):
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


@dataclass(frozen=True)
class PoolSpan:
    """One request's rows in a pass whose output is pooled: rows [first, last] (its whole prompt unless pooling the
    last token), truncated to `dimensions` (Matryoshka) when set."""

    first: int
    last: int
    dimensions: int | None = None


class Pooler:
    def __init__(self, config: PoolingConfig, dim: int, classify=None):
        """dim: the output's size; classify: a sequence classifier's head over [CLS] rows (a cross-encoder): its
        scores are the output."""
        self.config = config
        self.dim = dim
        self.classify = classify

    @property
    def needs_whole_prompt(self) -> bool:
        return self.classify is not None or self.config.needs_whole_prompt

    def __call__(self, hidden: torch.Tensor, spans: list[PoolSpan]) -> list[torch.Tensor]:
        """One vector per span, in float32, on hidden's device (enqueued)."""
        if not spans:
            return []
        dev = hidden.device
        if self.classify is not None:
            return list(self.classify(hidden[torch.tensor([s.first for s in spans], device=dev)]).float())
        kind = self.config.pooling
        if kind is PoolingType.MEAN:
            lens = torch.tensor([s.last - s.first + 1 for s in spans], device=dev)
            rows = torch.cat([torch.arange(s.first, s.last + 1, device=dev) for s in spans])
            seg = torch.repeat_interleave(torch.arange(len(spans), device=dev), lens)
            sums = torch.zeros(len(spans), hidden.shape[-1], dtype=torch.float32, device=dev)
            pooled = sums.index_add_(0, seg, hidden[rows].float()) / lens[:, None]
        else:
            rows = [s.last if kind is PoolingType.LAST else s.first for s in spans]
            pooled = hidden[torch.tensor(rows, device=dev)].float()
        if self.config.normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        out = []
        for s, vec in zip(spans, pooled):
            if s.dimensions is not None:
                vec = vec[: s.dimensions]
                if self.config.normalize:
                    vec = F.normalize(vec, p=2, dim=-1)
            out.append(vec)
        return out
