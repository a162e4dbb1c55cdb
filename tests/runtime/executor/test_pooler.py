"""Pooling without a model: the configuration read from sentence-transformers' files (and SGLang's defaults), and
each pooling over a pass's rows (several requests side by side), with normalization and Matryoshka truncation."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.executor.pooler import Pooler, PoolingConfig, PoolingType, PoolSpan
from tests.runtime.models.tiny_pooling import write_sentence_transformers


@pytest.mark.parametrize("causal,expected", [(True, PoolingType.LAST), (False, PoolingType.CLS)])
def test_defaults_without_sentence_transformers_files(tmp_path, causal, expected):
    assert PoolingConfig.from_model_dir(str(tmp_path), causal) == PoolingConfig(expected, True)


@pytest.mark.parametrize("mode,expected", [("mean_tokens", PoolingType.MEAN), ("cls_token", PoolingType.CLS),
                                           ("lasttoken", PoolingType.LAST)])
@pytest.mark.parametrize("normalize", [True, False])
def test_sentence_transformers_pooling_and_normalize(tmp_path, mode, expected, normalize):
    write_sentence_transformers(tmp_path, mode, normalize)
    cfg = PoolingConfig.from_model_dir(str(tmp_path), causal=True)
    assert cfg == PoolingConfig(expected, normalize)
    assert cfg.needs_whole_prompt == (expected is not PoolingType.LAST)


def test_unsupported_pooling_is_refused(tmp_path):
    write_sentence_transformers(tmp_path, "max_tokens", True)
    with pytest.raises(ValueError, match="max_tokens"):
        PoolingConfig.from_model_dir(str(tmp_path), causal=True)


def test_normalize_module_without_pooling_module(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "2", "type": "sentence_transformers.models.Normalize"}]))
    assert PoolingConfig.from_model_dir(str(tmp_path), causal=False) == PoolingConfig(PoolingType.CLS, True)


HIDDEN = torch.randn(9, 6, generator=torch.Generator().manual_seed(0))
SPANS = [PoolSpan(0, 3), PoolSpan(4, 4), PoolSpan(5, 8)]  # three requests' rows in one pass


@pytest.mark.parametrize("kind", list(PoolingType))
@pytest.mark.parametrize("normalize", [True, False])
def test_each_pooling_over_a_pass(kind, normalize):
    out = Pooler(PoolingConfig(kind, normalize), dim=6)(HIDDEN, SPANS)
    for span, vec in zip(SPANS, out):
        rows = HIDDEN[span.first : span.last + 1]
        want = {PoolingType.LAST: rows[-1], PoolingType.MEAN: rows.mean(0), PoolingType.CLS: rows[0]}[kind]
        torch.testing.assert_close(vec, F.normalize(want, dim=-1) if normalize else want)


def test_matryoshka_dimensions_are_renormalized():
    spans = [PoolSpan(0, 3, dimensions=2), PoolSpan(5, 8)]
    short, full = Pooler(PoolingConfig(PoolingType.MEAN, True), dim=6)(HIDDEN, spans)
    assert short.shape == (2,) and full.shape == (6,)
    torch.testing.assert_close(short, F.normalize(HIDDEN[0:4].mean(0)[:2], dim=-1))
    torch.testing.assert_close(short.norm(), torch.tensor(1.0))


def test_classifier_reads_the_first_row_of_each_prompt():
    head = torch.nn.Linear(6, 2)
    out = Pooler(PoolingConfig(PoolingType.CLS, True), dim=2, classify=head)(HIDDEN, SPANS)
    with torch.no_grad():
        for span, vec in zip(SPANS, out):
            torch.testing.assert_close(vec, head(HIDDEN[span.first]))  # scores: not normalized
