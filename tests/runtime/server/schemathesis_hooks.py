"""schemathesis hooks for the OpenAPI fuzz test: every body that reaches the server asks for little work (a
handful of tokens, at most 2 samples), so that a bounded run covers many cases on a CPU. The caps apply just
before each call (`before_call`), so every phase and both modes pass through them; a field the caps do not
touch (a string, a negative or a huge value of another type) is for the server to refuse."""
from __future__ import annotations

import schemathesis

CAPS = {"n": 2, "max_new_tokens": 4, "max_tokens": 4, "max_completion_tokens": 4, "min_new_tokens": 4,
        "min_tokens": 4, "max_output_tokens": 4, "top_logprobs_num": 5, "logprobs": 5, "top_logprobs": 5}
DEFAULT_MAX_TOKENS = 4


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def capped(value):
    if isinstance(value, dict):
        return {k: type(v)(min(v, CAPS[k])) if k in CAPS and _is_number(v) else capped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [capped(v) for v in value]
    return value


def with_default_length(path: str, body: dict) -> dict:
    """Fills in a small length where the body leaves it to the server: /generate's default is 128 tokens, a chat
    completion's is the rest of the context."""
    if path == "/generate":
        sp = body.get("sampling_params")
        if sp is None:
            return {**body, "sampling_params": {"max_new_tokens": DEFAULT_MAX_TOKENS}}
        for params in sp if isinstance(sp, list) else [sp]:
            if isinstance(params, dict) and params.get("max_new_tokens") is None:
                params["max_new_tokens"] = DEFAULT_MAX_TOKENS
    elif path == "/v1/chat/completions":
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            return {**body, "max_tokens": DEFAULT_MAX_TOKENS}
    elif path == "/v1/responses" and body.get("max_output_tokens") is None:
        return {**body, "max_output_tokens": DEFAULT_MAX_TOKENS}
    return body


def without_trainer(path: str, body: dict) -> dict:
    """Joining a weights-update group waits for its trainer (up to --dist-timeout): a generated address is emptied,
    so that the server refuses it at once instead."""
    if path == "/init_weights_update_group" and "master_address" in body:
        return {**body, "master_address": ""}
    return body


@schemathesis.hook
def before_call(ctx, case, kwargs):
    if isinstance(case.body, dict):
        case.body = without_trainer(case.operation.path, with_default_length(case.operation.path, capped(case.body)))
