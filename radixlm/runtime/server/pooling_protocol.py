"""Request models of the pooling routes: OpenAI's /v1/embeddings, SGLang's native /encode, /v1/rerank and its
scoring API /v1/score. Types are checked here; the bounds that need the model (vocabulary, context, the embedding's
size) are checked by radixlm.runtime.embeddings and the front, as for the Engine."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr

from radixlm.runtime.server.native_protocol import Prompt, TokenId, TokenIds
from radixlm.runtime.server.openapi import Doc, Int, at_most_one

Positive = Annotated[Int, Doc(minimum=1)]
Texts = Annotated[list[Prompt], Doc(minItems=1)]
TokenIdLists = Annotated[list[TokenIds], Doc(minItems=1)]


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request (`user` is accepted and ignored)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"input": "The food was delicious", "model": "default"}]})

    input: Prompt | Texts | TokenIds | TokenIdLists
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Positive | None = None
    user: StrictStr | None = None


class EmbeddingReqInput(BaseModel):
    """SGLang's /encode: text or input_ids (one prompt or a list of them)."""

    model_config = ConfigDict(json_schema_extra={"allOf": [at_most_one("text", "input_ids")],
                                                 "examples": [{"text": "The food was delicious"}]})

    text: Prompt | Texts | None = None
    input_ids: TokenIds | TokenIdLists | None = None
    dimensions: Positive | None = None
    rid: StrictStr | None = None


class V1RerankReqInput(BaseModel):
    """SGLang's rerank request: the documents ordered by their relevance to the query."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"query": "What is a panda?",
                                                               "documents": ["hi", "The giant panda is a bear."]}]})

    query: Prompt
    documents: Texts
    top_n: Positive | None = None
    return_documents: StrictBool = True
    model: StrictStr | None = None


class ScoringRequest(BaseModel):
    """SGLang's scoring API: for each item, the probability of each label token as the token after query + item
    (item + query with item_first); apply_softmax normalizes over the label tokens."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"query": "Is Paris the capital of France? Answer:",
                                                               "items": [" yes", " no"], "label_token_ids": [1, 2]}]})

    query: StrictStr | TokenIds | None = None
    items: Prompt | Texts | TokenIds | TokenIdLists
    label_token_ids: Annotated[list[TokenId], Doc(minItems=1)]
    apply_softmax: StrictBool = False
    item_first: StrictBool = False
    model: StrictStr | None = None
