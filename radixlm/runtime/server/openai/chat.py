"""POST /v1/chat/completions: messages through the tokenizer's chat template, chat-shaped logprobs, streaming deltas."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixlm.runtime.front import BuiltRequests
from radixlm.runtime.parsers.reasoning import ReasoningParser
from radixlm.runtime.server.errors import BadRequest
from radixlm.runtime.server.openai.common import (
    Usage, adapter_of, bootstrap_of, build, check_lengths, finish, merged_stream, new_id, respond, sse_body,
)
from radixlm.runtime.server.openai.protocol import ChatCompletionRequest, ChatMessage
from radixlm.runtime.server.openai.reasoning import (
    StreamedReasoning, keeps_special_tokens, reasoning_token_count, request_parser, split_text, starts_in_reasoning,
)
from radixlm.runtime.server.openai.tool_calls import StreamedTools, ToolPlan, finish_reason, plan_tools, tool_message


def chat_prompt_ids(tm, messages: list[ChatMessage], continue_final_message: bool = False,
                    chat_template_kwargs: dict | None = None, tools: list[dict] | None = None) -> list[int]:
    """The prompt the tokenizer's chat template makes of `messages` (also used by /v1/tokenize)."""
    if not messages:
        raise BadRequest("messages: must not be empty")
    cont = continue_final_message
    if cont and messages[-1].role != "assistant":
        raise BadRequest("continue_final_message needs the last message to be from the assistant")
    mm = tm.builder.mm
    msgs = [m.for_template(mm.image_token if mm is not None else None, mm.video_token if mm is not None else None)
            for m in messages]
    kwargs = {**(chat_template_kwargs or {}), **({"tools": tools} if tools else {})}
    try:
        text = tm.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=not cont,
                                                continue_final_message=cont, **kwargs)
    except Exception as e:  # noqa: BLE001 - jinja errors raised by the template for unsupported input
        raise BadRequest(f"messages: cannot apply the chat template: {e}") from None
    # The template already carries the special tokens (BOS included when the model uses one).
    ids = tm.tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise BadRequest("messages: the prompt is empty")
    return ids


def _entry(triple) -> dict:
    lp, _tid, text = triple
    text = text or ""
    return {"token": text, "bytes": list(text.encode("utf-8")), "logprob": lp}


def _chat_logprobs(meta: dict, start: int = 0) -> dict:
    triples = list(meta.get("output_token_logprobs", []))[start:]
    tops = list(meta.get("output_top_logprobs", []))[start:]
    tops += [[]] * (len(triples) - len(tops))
    return {"content": [{**_entry(t), "top_logprobs": [_entry(x) for x in top]} for t, top in zip(triples, tops)]}


async def prepare_chat(tm, req: ChatCompletionRequest) -> tuple[BuiltRequests, ToolPlan]:
    """Messages -> chat template -> checked, built requests, and how the output's tool calls are read: the pipeline
    /v1/chat/completions shares with /v1/responses and /v1/messages (they translate their requests into `req`)."""
    plan = plan_tools(req, tm.server_args.tool_call_parser, getattr(tm.tokenizer, "chat_template", None))
    ids = chat_prompt_ids(tm, req.messages, req.continue_final_message, req.chat_template_kwargs, plan.template_tools)
    images = [url for m in req.messages for url in m.image_urls()]
    videos = [url for m in req.messages for url in m.video_urls()]
    # The tokens the front will expand each image or video placeholder to count toward the lengths checked here.
    image_rows = tm.builder.media_token_count(len(images), len(videos))
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise BadRequest("top_logprobs: requires logprobs=true")
        most = tm.builder.limits.max_top_logprobs  # --max-logprobs
        if not 0 <= req.top_logprobs <= most:
            raise BadRequest(f"top_logprobs: must be in [0, {most}], got {req.top_logprobs}")
    max_new = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_new is not None and max_new < 1:
        raise BadRequest(f"max_completion_tokens must be positive, got {max_new}")
    n_prompt = len(ids) + image_rows
    check_lengths(tm, [ids], max_new or 0, image_rows)
    if max_new is None:
        info = tm.runtime.info  # until the context or the KV pool is full, whichever comes first
        max_new = min(info.context_len - n_prompt, info.max_total_num_tokens - n_prompt - 1)
    sampling = req.sampling_params(max_new)
    sampling.update(plan.sampling_params())
    reasoning_open = None
    if req.thinking_token_budget is not None:
        sampling["thinking_budget"] = req.thinking_token_budget
        if plan.ebnf is not None and not plan.forced:
            del sampling["ebnf"]  # "at most one call" (auto, not parallel): the parse keeps the first call anyway
        reasoning_open = starts_in_reasoning(tm.server_args.reasoning_parser, req.chat_template_kwargs)
    if keeps_special_tokens(tm.server_args.reasoning_parser):
        sampling["skip_special_tokens"] = False
    built = await build(tm, input_ids=ids, sampling_params=sampling, return_logprob=req.logprobs,
                        top_logprobs_num=req.top_logprobs or 0, rid=req.rid, extra_key=req.extra_key,
                        priority=req.priority, timeout_s=req.timeout_s, bootstrap=bootstrap_of(req), lora_path=adapter_of(tm, req),
                        image_data=images or None, video_data=videos or None, reasoning_open=reasoning_open)
    return built, plan


async def create_chat_completion(request: Request, req: ChatCompletionRequest) -> Response:
    tm = request.app.state.tokenizer_manager
    reasoning = request_parser(tm.server_args.reasoning_parser, req.separate_reasoning, req.chat_template_kwargs)
    built, plan = await prepare_chat(tm, req)
    if plan.forced:  # the constraint makes the output calls from its first token: there is no reasoning to split
        reasoning = None
    head = {"id": new_id("chatcmpl"), "created": int(time.time()), "model": req.model or tm.server_args.model_path}
    if req.stream:
        return StreamingResponse(sse_body(_stream(tm, built, req, head, plan, reasoning)), media_type="text/event-stream")

    def make(results: list[dict]) -> dict:
        choices, thoughts = [], []
        for i, r in enumerate(results):
            reason, matched = finish(r["meta_info"])
            reasoning_content, text = split_text(reasoning, r["text"])
            thoughts.append(reasoning_content)
            content, tool_calls = tool_message(plan, text)
            choices.append({
                "index": i, "message": {"role": "assistant", "content": content,
                                        "reasoning_content": reasoning_content, "tool_calls": tool_calls},
                "logprobs": _chat_logprobs(r["meta_info"]) if req.logprobs else None,
                "finish_reason": finish_reason(reason, tool_calls is not None), "matched_stop": matched,
            })
        spent = None if reasoning is None else reasoning_token_count(tm.tokenizer, thoughts)
        return {**head, "object": "chat.completion", "choices": choices,
                "usage": Usage.of(results, req.n, spent).to_dict()}

    return await respond(request, tm, built, make)


async def _stream(tm, built, req: ChatCompletionRequest, head: dict, plan: ToolPlan,
                  reasoning: ReasoningParser | None) -> AsyncIterator[dict]:
    head = {**head, "object": "chat.completion.chunk"}
    k = len(built.msgs)
    sent_text, sent_lp, last = [0] * k, [0] * k, [None] * k
    tools = [StreamedTools(plan) for _ in range(k)] if plan.fmt is not None else None
    thinking = [StreamedReasoning(reasoning) for _ in range(k)]

    def chunk(i: int, delta: dict, logprobs=None, reason=None, matched=None) -> dict:
        return {**head, "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason,
                                     "matched_stop": matched}], "usage": None}

    async for i, snap in merged_stream(tm, built):
        meta, text = snap["meta_info"], snap["text"]
        if last[i] is None:
            yield chunk(i, {"role": "assistant", "content": ""})
        last[i] = snap
        reason, matched = finish(meta)
        thought, text = thinking[i].feed(text, reason is not None)
        if thought:
            yield chunk(i, {"reasoning_content": thought})
        if tools is not None:
            delta = tools[i].delta(text, reason is not None)
            reason = finish_reason(reason, tools[i].called)
        else:
            delta = {"content": text[sent_text[i]:]} if len(text) > sent_text[i] else {}
            sent_text[i] = max(sent_text[i], len(text))
        lp = None
        if req.logprobs:
            lp = _chat_logprobs(meta, sent_lp[i])
            sent_lp[i] = len(meta.get("output_token_logprobs", []))
        if not delta and reason is None and not (lp and lp["content"]):
            continue
        yield chunk(i, delta or {"content": ""}, lp, reason, matched)
    if req.include_usage:
        spent = None if reasoning is None else reasoning_token_count(tm.tokenizer, [t.reasoning for t in thinking])
        yield {**head, "choices": [], "usage": Usage.of([s for s in last if s is not None], req.n, spent).to_dict()}
