"""schemathesis hooks for the OpenAPI fuzz test: generated bodies stay valid, but the work each one asks for is
capped (a handful of tokens, at most 2 samples) so that a bounded run covers many cases on a CPU."""
from __future__ import annotations

import schemathesis

CAPS = {"n": 2, "max_new_tokens": 8, "max_tokens": 8, "max_completion_tokens": 8, "min_new_tokens": 8,
        "min_tokens": 8, "top_logprobs_num": 5, "logprobs": 5, "top_logprobs": 5}


def _cap(value):
    if isinstance(value, dict):
        return {k: min(v, CAPS[k]) if k in CAPS and type(v) is int else _cap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cap(v) for v in value]
    return value


@schemathesis.hook
def map_body(ctx, body):
    return _cap(body)
