"""POST /v1/completions: legacy text completions (echo, legacy logprobs, n, batch prompts, streaming)."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.common import (
    Usage, adapter_of, bootstrap_of, build, check_lengths, finish, merged_stream, new_id, respond, sse_body,
)
from radixlm.runtime.server.openai.protocol import CompletionRequest


def _prompts(tm, req: CompletionRequest) -> tuple[list[list[int]], list[str]]:
    """(token ids, text) of every prompt; the text is what echo prepends."""
    p = req.prompt
    if isinstance(p, list) and not p:
        raise BadRequest("prompt: must not be empty")
    if isinstance(p, str) or isinstance(p[0], str):
        texts = [p] if isinstance(p, str) else list(p)
        try:
            return [tm.builder.tokenize(t, None) for t in texts], texts
        except ValueError as e:
            raise BadRequest(f"prompt: {e}") from None
    id_lists = [p] if isinstance(p[0], int) else list(p)
    try:
        ids = [tm.builder.tokenize(None, x) for x in id_lists]
    except ValueError as e:
        raise BadRequest(f"prompt: {e}") from None
    return ids, [tm.tokenizer.decode(x) for x in ids]


class _Offsets:
    """Legacy logprobs of one choice, built piecewise so streamed chunks continue the text offsets."""

    def __init__(self, start: int):
        self.offset = start

    def logprobs(self, triples: list, tops: list) -> dict:
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for (lp, _tid, text), top in zip(triples, tops):
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(None if top is None else {t[2]: t[0] for t in top})
            out["text_offset"].append(self.offset)
            self.offset += len(text or "")
        return out


def _pieces(meta: dict, echo: bool, out_from: int = 0, with_input: bool = True) -> tuple[list, list]:
    triples = list(meta.get("output_token_logprobs", []))[out_from:]
    tops = list(meta.get("output_top_logprobs", []))[out_from:]
    tops += [[]] * (len(triples) - len(tops))
    if echo and with_input:
        ins = list(meta.get("input_token_logprobs", []))
        in_tops = list(meta.get("input_top_logprobs", []))
        in_tops += [None] * (len(ins) - len(in_tops))
        triples, tops = ins + triples, in_tops + tops
    return triples, tops


async def create_completion(request: Request, req: CompletionRequest) -> Response:
    tm = request.app.state.tokenizer_manager
    ids, texts = _prompts(tm, req)
    max_new = 16 if req.max_tokens is None else req.max_tokens
    if max_new < (0 if req.echo else 1):
        raise BadRequest(f"max_tokens must be {'>= 0' if req.echo else 'positive'}, got {max_new}")
    if req.logprobs is not None and req.logprobs < 0:
        raise BadRequest(f"logprobs must be >= 0, got {req.logprobs}")
    check_lengths(tm, ids, max_new)
    want_lp = req.logprobs is not None
    built = await build(tm, input_ids=ids if len(ids) > 1 else ids[0], sampling_params=req.sampling_params(max_new),
                        return_logprob=want_lp, logprob_start_len=0 if (want_lp and req.echo) else None,
                        top_logprobs_num=req.logprobs or 0, rid=req.rid, extra_key=req.extra_key,
                        priority=req.priority, timeout_s=req.timeout_s, bootstrap=bootstrap_of(req), lora_path=adapter_of(tm, req))
    cid, created, model = new_id("cmpl"), int(time.time()), req.model or tm.server_args.model_path
    prompt_text = [texts[i // req.n] for i in range(len(built.msgs))]
    head = {"id": cid, "object": "text_completion", "created": created, "model": model}
    if req.stream:
        return StreamingResponse(sse_body(_stream(tm, built, req, prompt_text, head)), media_type="text/event-stream")

    def make(results: list[dict]) -> dict:
        choices = []
        for i, r in enumerate(results):
            meta = r["meta_info"]
            reason, matched = finish(meta)
            echo = prompt_text[i] if req.echo else ""
            lp = _Offsets(0 if req.echo else len(prompt_text[i])).logprobs(*_pieces(meta, req.echo)) if want_lp else None
            choices.append({"index": i, "text": echo + r["text"], "logprobs": lp, "finish_reason": reason,
                            "matched_stop": matched})
        return {**head, "choices": choices, "usage": Usage.of(results, req.n).to_dict()}

    return await respond(request, tm, built, make)


async def _stream(tm, built, req: CompletionRequest, prompt_text: list[str], head: dict) -> AsyncIterator[dict]:
    k = len(built.msgs)
    sent_text, sent_lp = [0] * k, [0] * k
    offsets = [_Offsets(0 if req.echo else len(t)) for t in prompt_text]
    started, last = [False] * k, [None] * k
    async for i, snap in merged_stream(tm, built):
        meta, text = snap["meta_info"], snap["text"]
        last[i] = snap
        delta = text[sent_text[i]:]
        sent_text[i] = max(sent_text[i], len(text))
        first = not started[i]
        started[i] = True
        if first and req.echo:
            delta = prompt_text[i] + delta
        lp = None
        if req.logprobs is not None:
            lp = offsets[i].logprobs(*_pieces(meta, req.echo, sent_lp[i], with_input=first))
            sent_lp[i] = len(meta.get("output_token_logprobs", []))
        reason, matched = finish(meta)
        if not delta and reason is None and not (lp and lp["tokens"]):
            continue
        yield {**head, "choices": [{"index": i, "text": delta, "logprobs": lp, "finish_reason": reason,
                                    "matched_stop": matched}], "usage": None}
    if req.include_usage:
        yield {**head, "choices": [], "usage": Usage.of([s for s in last if s is not None], req.n).to_dict()}
