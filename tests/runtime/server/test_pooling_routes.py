"""The pooling routes in process (the app over a tokenizer manager stand-in that steps a tiny checkpoint's scheduler
on the test's thread): a cross-encoder's /v1/rerank equals transformers' scores, sorted, with top_n and
return_documents; /v1/score's label probabilities equal transformers' next-token distribution; and each route's
refusals in OpenAI's error shape."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import BertForSequenceClassification

from radixlm.runtime.embeddings import build_embed_requests
from radixlm.runtime.server.http_app import create_app
from tests.runtime.models.tiny import ARCH, save_tiny
from tests.runtime.models.tiny_pooling import LocalScheduler, decoder_config, save_encoder


class LocalTokenizerManager:
    """What the pooling routes use of a TokenizerManager, over a LocalScheduler."""

    def __init__(self, local: LocalScheduler):
        self.local = local
        self.builder = local.builder
        self.server_args = SimpleNamespace(model_path="tiny", api_key=None, responses_store_size=0)
        pooler = local.pooler
        self.runtime = SimpleNamespace(info=SimpleNamespace(
            cross_encoder=pooler is not None and pooler.classify is not None,
            embedding_dim=pooler.dim if pooler is not None else 0))

    def build_embed(self, **kwargs):
        return build_embed_requests(self.builder, **kwargs)

    async def build_async(self, **kwargs):
        return self.builder.build(**kwargs)

    async def generate(self, built, return_text: bool, log_metrics: bool = True):
        results = self.local.run(built.msgs)
        return results if built.as_list else results[0]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("cross-encoder")
    hf, tok = save_encoder(path, BertForSequenceClassification, seed=5)
    return TestClient(create_app(LocalTokenizerManager(LocalScheduler(path)))), hf, tok


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    path = tmp_path_factory.mktemp("generator")
    config = decoder_config("llama")
    config.architectures = [ARCH["llama"]]
    hf = save_tiny(config, path, seed=2)
    return TestClient(create_app(LocalTokenizerManager(LocalScheduler(path, is_embedding=False)))), hf


def test_rerank_with_a_cross_encoder(cross_encoder):
    client, hf, tok = cross_encoder
    query, docs = "what is a panda", ["a fast red car", "the panda eats bamboo", "the dog ran", "big house"]
    with torch.no_grad():
        want = [hf(**tok(query, d, return_tensors="pt")).logits[0, 0].item() for d in docs]
    items = client.post("/v1/rerank", json={"query": query, "documents": docs}).json()
    assert [it["index"] for it in items] == sorted(range(len(docs)), key=lambda i: -want[i])
    for it in items:
        assert it["document"] == docs[it["index"]]
        assert it["score"] == pytest.approx(want[it["index"]], abs=1e-5)
    top = client.post("/v1/rerank", json={"query": query, "documents": docs, "top_n": 2,
                                          "return_documents": False}).json()
    assert [it["index"] for it in top] == [it["index"] for it in items[:2]]
    assert all(it["document"] is None for it in top)


@pytest.mark.parametrize("body,match", [
    ({"query": "what", "documents": []}, "documents"),
    ({"query": "what", "documents": ["cat"], "top_n": 0}, "top_n"),
    ({"documents": ["cat"]}, "query"),
])
def test_rerank_refusals(cross_encoder, body, match):
    r = cross_encoder[0].post("/v1/rerank", json=body)
    assert r.status_code == 400 and match in r.json()["error"]["message"]


def test_score_label_probabilities(generator):
    client, hf = generator
    query, items, labels = [3, 9, 4], [[7, 1], [2], [5, 5, 6]], [11, 12, 40]
    for apply_softmax in (False, True):
        body = {"query": query, "items": items, "label_token_ids": labels, "apply_softmax": apply_softmax}
        scores = client.post("/v1/score", json=body).json()["scores"]
        for item, got in zip(items, scores):
            with torch.no_grad():
                logits = hf(torch.tensor([query + item])).logits[0, -1]
            want = (torch.softmax(logits[labels], -1) if apply_softmax else torch.softmax(logits, -1)[labels]).tolist()
            assert got == pytest.approx(want, abs=1e-5)
            assert not apply_softmax or math.isclose(sum(got), 1.0, abs_tol=1e-6)


def test_score_item_first_and_text(generator):
    client, hf = generator
    first = client.post("/v1/score", json={"query": [3, 9], "items": [[7]], "label_token_ids": [1],
                                           "item_first": True}).json()["scores"]
    plain = client.post("/v1/score", json={"query": [7], "items": [[3, 9]], "label_token_ids": [1]}).json()["scores"]
    assert first == plain
    text = client.post("/v1/score", json={"query": "t7", "items": [" t3 t9"], "label_token_ids": [1]}).json()
    assert text["scores"][0] == pytest.approx(plain[0], abs=1e-6) and text["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("path,body,match", [
    ("/v1/score", {"query": [3], "items": [[1]], "label_token_ids": [64]}, "label_token_ids"),
    ("/v1/score", {"query": [3], "items": [[1]], "label_token_ids": []}, "label_token_ids"),
    ("/v1/score", {"query": "t3", "items": [[1]], "label_token_ids": [1]}, "both be text"),
    ("/v1/embeddings", {"input": "t1 t2"}, "--is-embedding"),
    ("/v1/rerank", {"query": "t1", "documents": ["t2"]}, "--is-embedding"),
])
def test_generation_server_refusals(generator, path, body, match):
    r = generator[0].post(path, json=body)
    assert r.status_code == 400 and match in r.json()["error"]["message"], r.json()


def test_score_on_an_embedding_server_is_refused(cross_encoder):
    r = cross_encoder[0].post("/v1/score", json={"query": "what", "items": ["cat"], "label_token_ids": [5]})
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]
