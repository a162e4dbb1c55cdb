"""One `radixlm serve --is-embedding` over a tiny random Qwen3 backbone: /v1/embeddings through the openai SDK (float
and base64, dimensions) and langchain-openai's OpenAIEmbeddings equal transformers' pooled outputs; /encode; /v1/rerank
by cosine similarity; every refusal a 400 in its API's shape."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.runtime.models.tiny_pooling import hf_pooled, save_decoder
from tests.runtime.server.conftest import start_server, stop_server

TEXTS = ["t1 t2 t3 t4", "t5", "t9 t8 t7"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-embedding")
    hf = save_decoder(path, "qwen3")
    handle = start_server("--model-path", str(path), "--is-embedding", "--dtype", "float32")
    yield handle, hf
    stop_server(handle)


def want(hf, text: str) -> np.ndarray:
    return hf_pooled(hf, [int(w[1:]) for w in text.split()], "last", True).numpy()


def test_openai_sdk_embeddings(served):
    import openai

    handle, hf = served
    client = openai.OpenAI(base_url=handle.base_url + "/v1", api_key="none")
    by_float = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    by_base64 = client.embeddings.create(model="tiny", input=TEXTS)  # the SDK asks for base64 and decodes it
    for i, text in enumerate(TEXTS):
        np.testing.assert_allclose(by_float.data[i].embedding, want(hf, text), atol=1e-5)
        # A second request of the same texts may be batched (or reuse cached prefixes) otherwise: float32 sums that
        # differ in their last bits (1.4e-7 in a full run of the suite here), not the encoding.
        np.testing.assert_allclose(by_base64.data[i].embedding, by_float.data[i].embedding, rtol=0, atol=1e-6)
    assert by_float.usage.prompt_tokens == by_float.usage.total_tokens == 8
    short = client.embeddings.create(model="tiny", input=[[1, 2, 3, 4]], dimensions=8, encoding_format="float")
    vec = want(hf, TEXTS[0])[:8]
    np.testing.assert_allclose(short.data[0].embedding, vec / np.linalg.norm(vec), atol=1e-5)


def test_langchain_openai_embeddings(served):
    from langchain_openai import OpenAIEmbeddings

    handle, hf = served
    # check_embedding_ctx_length=False: send the texts (else it sends tiktoken's token ids of another vocabulary).
    emb = OpenAIEmbeddings(model="tiny", base_url=handle.base_url + "/v1", api_key="none",
                           check_embedding_ctx_length=False)
    docs = emb.embed_documents(TEXTS[:2])
    np.testing.assert_allclose(docs, [want(hf, t) for t in TEXTS[:2]], atol=1e-5)
    np.testing.assert_allclose(emb.embed_query(TEXTS[2]), want(hf, TEXTS[2]), atol=1e-5)


def test_native_encode_reuses_the_cache(served):
    handle, hf = served
    one = handle.client.post("/encode", json={"text": "t3 t1 t4 t1 t5"}).json()
    np.testing.assert_allclose(one["embedding"], want(hf, "t3 t1 t4 t1 t5"), atol=1e-5)
    both = handle.client.post("/encode", json={"input_ids": [[3, 1, 4, 1, 5, 9], [2, 6]]}).json()
    assert both[0]["meta_info"]["cached_tokens"] == 5  # the first prompt's KV, kept by the radix cache
    np.testing.assert_allclose(both[1]["embedding"], want(hf, "t2 t6"), atol=1e-5)


def test_rerank_by_cosine_similarity(served):
    handle, hf = served
    query, docs = "t1 t2", ["t3", "t1 t2 t3", "t7 t7"]
    items = handle.client.post("/v1/rerank", json={"query": query, "documents": docs}).json()
    scores = [float(want(hf, query) @ want(hf, d)) for d in docs]
    assert [it["index"] for it in items] == sorted(range(3), key=lambda i: -scores[i])
    for it in items:
        assert it["score"] == pytest.approx(scores[it["index"]], abs=1e-5)
        assert it["document"] == docs[it["index"]]


@pytest.mark.parametrize("path,body,match", [
    ("/v1/embeddings", {"input": ""}, "empty"),
    ("/v1/embeddings", {"input": []}, "non-empty"),
    ("/v1/embeddings", {"input": [[]]}, "empty"),
    ("/v1/embeddings", {"input": [1] * 129}, "context length"),
    ("/v1/embeddings", {"input": "t1", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "t1", "dimensions": 33}, "dimensions"),
    ("/v1/embeddings", {"input": [64]}, "input_ids"),
    ("/v1/embeddings", {"input": "t1", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/completions", {"prompt": "t1", "max_tokens": 1}, "embedding model"),
    ("/v1/score", {"query": "t1", "items": ["t2"], "label_token_ids": [1]}, "embedding model"),
    ("/v1/rerank", {"query": "t1", "documents": []}, "documents"),
])
def test_openai_refusals(served, path, body, match):
    r = served[0].client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert match in r.json()["error"]["message"]


def test_native_refusals(served):
    client = served[0].client
    for path, body in (("/generate", {"text": "t1", "sampling_params": {"max_new_tokens": 1}}),
                       ("/encode", {"text": "t1", "input_ids": [1]}), ("/encode", {})):
        r = client.post(path, json=body)
        assert r.status_code == 400 and r.json()["object"] == "error", (path, r.text)
    assert client.get("/health_generate").status_code == 200
