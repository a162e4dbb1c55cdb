"""Embedding and rerank requests (--is-embedding), shared by the Engine and the tokenizer manager: validated and
tokenized into prefill-only TokenizedGenerateReqInputs (embed=True), whose answers carry a pooled vector."""
from __future__ import annotations

import uuid
from collections.abc import Sequence

from radixlm.runtime.front import BuiltRequests, RequestBuilder
from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampling_params import SamplingParams

MAX_EMBED_INPUTS = 2048  # inputs per request: OpenAI's cap for /v1/embeddings
NOT_EMBEDDING = "this server does not serve an embedding model: start it with --is-embedding"


def _is_int(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _prompts(texts, input_ids, pairs) -> tuple[list, bool, str]:
    """(items, whether the caller gets a list, kind: text / ids / pair)."""
    given = [name for name, v in (("text", texts), ("input_ids", input_ids), ("pairs", pairs)) if v is not None]
    if len(given) != 1:
        raise ValueError("exactly one of text (prompt), input_ids or pairs must be given")
    if texts is not None:
        if isinstance(texts, str):
            return [texts], False, "text"
        if isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts):
            return texts, True, "text"
        raise ValueError("input must be a string or a non-empty list of strings")
    if input_ids is not None:
        if isinstance(input_ids, list) and input_ids and all(_is_int(t) for t in input_ids):
            return [input_ids], False, "ids"
        if isinstance(input_ids, list) and input_ids and all(isinstance(x, list) for x in input_ids):
            return input_ids, True, "ids"
        raise ValueError("token input must be a non-empty list of token ids or a non-empty list of such lists")
    if isinstance(pairs, list) and pairs and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
        return pairs, True, "pair"
    raise ValueError("pairs must be a non-empty list of [text, text] pairs")


def build_embed_requests(builder: RequestBuilder, texts: str | list[str] | None = None,
                         input_ids: list[int] | list[list[int]] | None = None,
                         pairs: Sequence[Sequence[str]] | None = None, dimensions: int | None = None,
                         rid: str | None = None) -> BuiltRequests:
    """One request per input. Raises ValueError naming the problem (empty or too long input, dimensions out of
    range, a server without --is-embedding)."""
    limits = builder.limits
    if limits.embedding_dim <= 0:
        raise ValueError(NOT_EMBEDDING)
    items, as_list, kind = _prompts(texts, input_ids, pairs)
    if len(items) > MAX_EMBED_INPUTS:
        raise ValueError(f"at most {MAX_EMBED_INPUTS} inputs per request, got {len(items)}")
    if dimensions is not None and not (_is_int(dimensions) and 1 <= dimensions <= limits.embedding_dim):
        raise ValueError(f"dimensions must be an integer in [1, {limits.embedding_dim}], got {dimensions!r}")
    if rid is not None and not isinstance(rid, str):
        raise ValueError("rid must be a string")
    base = rid or uuid.uuid4().hex
    sp = SamplingParams(max_new_tokens=0)
    sp.normalize()
    msgs = []
    for i, item in enumerate(items):
        types = None
        if kind == "pair":
            enc = builder.tokenizer(item[0], item[1])
            ids = list(enc["input_ids"])
            types = list(enc["token_type_ids"]) if "token_type_ids" in enc and any(enc["token_type_ids"]) else None
        else:
            if kind == "text" and not item:
                raise ValueError(f"input {i} is an empty string")
            ids = builder.tokenize(item if kind == "text" else None, item if kind == "ids" else None)
        if len(ids) > limits.context_len:
            raise ValueError(f"input {i} has {len(ids)} tokens, more than the model's context length "
                             f"({limits.context_len})")
        if len(ids) + 1 >= limits.max_total_num_tokens:
            raise ValueError(f"input {i} ({len(ids)} tokens) does not fit the KV pool "
                             f"({limits.max_total_num_tokens} tokens)")
        msgs.append(TokenizedGenerateReqInput(
            rid=base if len(items) == 1 and not as_list else f"{base}-{i}", input_ids=ids, sampling_params=sp,
            embed=True, dimensions=dimensions, token_type_ids=types))
    return BuiltRequests(msgs, as_list, [])
