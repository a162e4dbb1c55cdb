"""Engine.encode's own logic without a model: prompts, pairs and token ids become embed requests (the builder's
bounds apply), the answers come back in order, and a request that ends without a vector raises."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.front import FrontLimits, RequestBuilder


class PairTokenizer:
    """Words are ids; a pair is its two halves with segment ids 0 and 1."""

    def encode(self, text):
        return [int(w) for w in text.split()]

    def __call__(self, a, b):
        ids_a, ids_b = self.encode(a), self.encode(b)
        return {"input_ids": ids_a + ids_b, "token_type_ids": [0] * len(ids_a) + [1] * len(ids_b)}


def fake_engine(answer=lambda m: {"embedding": [float(len(m.input_ids))], "meta_info": {}}):
    sent = []

    def run_all(msgs):
        sent.extend(msgs)
        return [answer(m) for m in msgs]

    builder = RequestBuilder(PairTokenizer(), FrontLimits(100, 16, 1000, embedding_dim=8))
    return SimpleNamespace(builder=builder, _run_all=run_all), sent


def test_prompts_pairs_and_token_ids():
    engine, sent = fake_engine()
    assert Engine.encode(engine, "1 2 3")["embedding"] == [3.0]
    assert [r["embedding"] for r in Engine.encode(engine, ["1", "2 3"], dimensions=4)] == [[1.0], [2.0]]
    Engine.encode(engine, [["1 2", "3"]])
    Engine.encode(engine, input_ids=[[5, 6]])
    assert all(m.embed and m.sampling_params.max_new_tokens == 0 for m in sent)
    assert sent[1].dimensions == 4
    assert sent[3].input_ids == [1, 2, 3] and sent[3].token_type_ids == [0, 0, 1]
    assert sent[4].input_ids == [5, 6] and sent[4].token_type_ids is None


@pytest.mark.parametrize("kwargs,match", [
    ({"prompt": ""}, "empty"), ({"prompt": []}, "non-empty"), ({"input_ids": [[]]}, "empty"),
    ({"prompt": " ".join(["1"] * 17)}, "context length"), ({"prompt": "1", "dimensions": 9}, "dimensions"),
    ({"input_ids": [100]}, "input_ids"), ({}, "exactly one"),
])
def test_bounds(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Engine.encode(fake_engine()[0], **kwargs)


def test_a_request_without_a_vector_raises():
    engine, _ = fake_engine(lambda m: {"text": "", "meta_info": {"finish_reason": {"type": "abort"}}})
    with pytest.raises(RuntimeError, match="encoding failed"):
        Engine.encode(engine, "1")


def test_generation_is_refused_on_an_embedding_engine():
    with pytest.raises(ValueError, match="embedding model"):
        fake_engine()[0].builder.build(input_ids=[1, 2], sampling_params={"max_new_tokens": 1})
