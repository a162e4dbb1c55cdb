"""Pooling routes: /encode (SGLang's native embedding route), /v1/embeddings (OpenAI's shape), /v1/rerank
(SGLang's: a cross-encoder's scores, or an embedding model's cosine similarity), and /v1/score (SGLang's scoring API
on a generation server: label tokens' probabilities after query + item)."""
from __future__ import annotations

import base64
import math
import time

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixlm.runtime.server.errors import BadRequest, parse
from radixlm.runtime.server.native import ClientDisconnected, generate_or_abort, json_response, read_json_object
from radixlm.runtime.server.openapi import request_body
from radixlm.runtime.server.pooling_protocol import EmbeddingReqInput, EmbeddingRequest, ScoringRequest, V1RerankReqInput

router = APIRouter()


def _built(tm, **kwargs):
    try:
        return tm.build_embed(**kwargs)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e)) from None


async def _results(request: Request, tm, built) -> list[dict] | None:
    """Every request's final snapshot, in order; None when the client went away (its requests were aborted)."""
    try:
        res = await generate_or_abort(request, tm, built, False)
    except ClientDisconnected:
        return None
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return res if isinstance(res, list) else [res]


def _texts_or_ids(value) -> dict:
    """An input that is text (a string or strings) or token ids (a list of ids or of id lists)."""
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], str)):
        return {"texts": value}
    return {"input_ids": value}


@router.post("/encode", openapi_extra=request_body(EmbeddingReqInput))
async def encode(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: EmbeddingReqInput = parse(EmbeddingReqInput, await read_json_object(request))
    built = _built(tm, texts=req.text, input_ids=req.input_ids, dimensions=req.dimensions, rid=req.rid)
    results = await _results(request, tm, built)
    if results is None:
        return Response(status_code=499)
    return json_response(results if built.as_list else results[0])


def _encode_vector(vec: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # OpenAI's: the float32 array's little-endian bytes
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
    return vec


@router.post("/v1/embeddings", openapi_extra=request_body(EmbeddingRequest))
async def embeddings(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: EmbeddingRequest = parse(EmbeddingRequest, await read_json_object(request))
    built = _built(tm, dimensions=req.dimensions, **_texts_or_ids(req.input))
    results = await _results(request, tm, built)
    if results is None:
        return Response(status_code=499)
    tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    data = [{"object": "embedding", "index": i, "embedding": _encode_vector(r["embedding"], req.encoding_format)}
            for i, r in enumerate(results)]
    return json_response({"object": "list", "data": data, "model": req.model or tm.server_args.model_path,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


@router.post("/v1/rerank", openapi_extra=request_body(V1RerankReqInput))
async def rerank(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: V1RerankReqInput = parse(V1RerankReqInput, await read_json_object(request))
    if not req.documents:
        raise BadRequest("documents must be a non-empty list of strings")
    if req.top_n is not None and req.top_n < 1:
        raise BadRequest(f"top_n must be >= 1, got {req.top_n}")
    if tm.runtime.info.cross_encoder:
        built = _built(tm, pairs=[[req.query, d] for d in req.documents])
    else:  # an embedding model: the query's embedding against each document's
        built = _built(tm, texts=[req.query, *req.documents])
    results = await _results(request, tm, built)
    if results is None:
        return Response(status_code=499)
    if tm.runtime.info.cross_encoder:
        scores = [r["embedding"][0] for r in results]
    else:
        query = np.asarray(results[0]["embedding"])
        scores = [float(np.dot(query, r["embedding"])) for r in results[1:]]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.top_n]
    return json_response([{"score": scores[i], "document": req.documents[i] if req.return_documents else None,
                           "index": i, "meta_info": results[i if tm.runtime.info.cross_encoder else i + 1]["meta_info"]}
                          for i in order])


def _score_prompts(req: ScoringRequest) -> dict:
    """query + item (item + query with item_first) for each item, as text or token ids."""
    items = req.items if isinstance(req.items, list) and req.items and isinstance(req.items[0], (str, list)) \
        else [req.items]
    text = isinstance(items[0], str)
    query = req.query if req.query is not None else ("" if text else [])
    if isinstance(query, str) != text:
        raise BadRequest("query and items must both be text or both be token ids")
    joined = [item + query if req.item_first else query + item for item in items]
    return {"prompt": joined} if text else {"input_ids": joined}


@router.post("/v1/score", openapi_extra=request_body(ScoringRequest))
async def score(request: Request) -> Response:
    tm = request.app.state.tokenizer_manager
    req: ScoringRequest = parse(ScoringRequest, await read_json_object(request))
    vocab = tm.builder.limits.vocab_size
    if not req.label_token_ids:
        raise BadRequest("label_token_ids must be a non-empty list of token ids")
    if any(not 0 <= t < vocab for t in req.label_token_ids):
        raise BadRequest(f"label_token_ids must be in [0, {vocab})")
    try:
        built = await tm.build_async(**_score_prompts(req), sampling_params={"max_new_tokens": 0},
                                     return_logprob=True)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e)) from None
    for m in built.msgs:
        m.token_ids_logprob = list(req.label_token_ids)
    results = await _results(request, tm, built)
    if results is None:
        return Response(status_code=499)
    scores = []
    for r in results:
        lps = [lp for lp, _tok, _text in r["meta_info"]["output_token_ids_logprobs"][0]]
        if req.apply_softmax:
            top = max(lps)
            exps = [math.exp(lp - top) for lp in lps]
            scores.append([e / sum(exps) for e in exps])
        else:
            scores.append([math.exp(lp) for lp in lps])
    tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    return json_response({"object": "scoring", "scores": scores, "created": int(time.time()),
                          "model": req.model or tm.server_args.model_path,
                          "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}})
