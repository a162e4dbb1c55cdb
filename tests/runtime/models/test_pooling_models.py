"""Pooled outputs (--is-embedding) against transformers, float32: decoder backbones (last-token and mean pooling, with
radix reuse where the pooling allows it), BERT embeddings, and BERT and XLM-RoBERTa cross-encoders' scores (sentence
pairs, with BERT's token types). Each steps the front and the scheduler on the test's thread (LocalScheduler), as
the Engine does on its own."""
from __future__ import annotations

import pytest
import torch
from transformers import BertForSequenceClassification, BertModel, XLMRobertaForSequenceClassification

from tests.runtime.models.tiny import random_prompts
from tests.runtime.models.tiny_pooling import LocalScheduler, hf_pooled, save_decoder, save_encoder

TOL = dict(atol=1e-5, rtol=0)


def test_decoder_last_token_reuses_the_radix_cache(tmp_path):
    hf = save_decoder(tmp_path, "qwen3")
    prompts = random_prompts(1, [7, 1, 12], 64)
    local = LocalScheduler(tmp_path)
    first = local.encode(input_ids=prompts)
    (again,) = local.encode(input_ids=prompts[0] + [5])  # the first prompt is cached: only the new token is computed
    (short,) = local.encode(input_ids=prompts[2], dimensions=4)
    for ids, out in zip(prompts, first):
        torch.testing.assert_close(torch.tensor(out["embedding"]), hf_pooled(hf, ids, "last", True), **TOL)
    torch.testing.assert_close(torch.tensor(again["embedding"]), hf_pooled(hf, prompts[0] + [5], "last", True), **TOL)
    assert again["meta_info"]["cached_tokens"] == 7
    want = hf_pooled(hf, prompts[2], "last", True)[:4]
    torch.testing.assert_close(torch.tensor(short["embedding"]), want / want.norm(), **TOL)


def test_decoder_mean_pooling_from_sentence_transformers_files(tmp_path):
    hf = save_decoder(tmp_path, "llama", pooling="mean_tokens", normalize=False)
    prompts = random_prompts(2, [6, 3], 64)
    local = LocalScheduler(tmp_path)
    outs = local.encode(input_ids=prompts)
    (again,) = local.encode(input_ids=[prompts[0]])
    with pytest.raises(ValueError, match="embedding model"):
        local.builder.build(input_ids=prompts[0], sampling_params={"max_new_tokens": 1})
    for ids, out in zip(prompts, outs):
        torch.testing.assert_close(torch.tensor(out["embedding"]), hf_pooled(hf, ids, "mean", False), **TOL)
    assert again["meta_info"]["cached_tokens"] == 0  # a mean reads every row: no prefix stands in for them


def test_bert_cls_embeddings(tmp_path):
    hf, tok = save_encoder(tmp_path, BertModel)
    texts = ["the cat sat on the mat", "a big red car", "dog"]
    local = LocalScheduler(tmp_path)
    outs = local.encode(texts=texts)
    with pytest.raises(ValueError, match=r"dimensions must be an integer in \[1, 32\]"):
        local.encode(texts=texts, dimensions=33)
    for text, out in zip(texts, outs):
        ids = tok(text)["input_ids"]
        torch.testing.assert_close(torch.tensor(out["embedding"]), hf_pooled(hf, ids, "cls", True), **TOL)


@pytest.mark.parametrize("kind,model_cls", [("bert", BertForSequenceClassification),
                                            ("xlm-roberta", XLMRobertaForSequenceClassification)])
def test_cross_encoder_scores(tmp_path, kind, model_cls):
    hf, tok = save_encoder(tmp_path, model_cls, kind, seed=3)
    pairs = [["what is a panda", "the panda eats bamboo"], ["what is a panda", "a fast red car"], ["dog", "cat"]]
    local = LocalScheduler(tmp_path)
    outs = local.encode(pairs=pairs)
    # XLM-R's positions start after its padding index (0 here): 66 positions hold 65 tokens.
    assert local.builder.limits.context_len == (65 if kind == "xlm-roberta" else 64)
    with torch.no_grad():
        for (query, doc), out in zip(pairs, outs):
            enc = tok(query, doc, return_tensors="pt")
            if kind == "bert":
                assert enc["token_type_ids"].any()  # the document's tokens are segment 1
            torch.testing.assert_close(torch.tensor(out["embedding"]), hf(**enc).logits[0], **TOL)
