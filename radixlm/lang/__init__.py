"""The SGLang frontend language: primitives, the interpreter, backends. Backends load on first use."""
from __future__ import annotations

from radixlm.lang.api import (assistant, assistant_begin, assistant_end, flush_cache, function, gen, gen_int,
                              gen_string, get_server_info, image, select, separate_reasoning, set_default_backend,
                              system, system_begin, system_end, user, user_begin, user_end, video)
from radixlm.lang.choices import greedy_token_selection, token_length_normalized, unconditional_likelihood_normalized
from radixlm.lang.global_config import global_config
from radixlm.lang.interpreter import ProgramError
from radixlm.lang.state import ProgramState, ProgramStateGroup
from radixlm.lang.tracer import TracingError

_LAZY = {
    "RuntimeEndpoint": "radixlm.lang.backend.runtime_endpoint",
    "OpenAI": "radixlm.lang.backend.openai",
    "Anthropic": "radixlm.lang.backend.anthropic",
    "LiteLLM": "radixlm.lang.backend.litellm",
    "VertexAI": "radixlm.lang.backend.vertexai",
    "Runtime": "radixlm.lang.runtime",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'radixlm.lang' has no attribute {name!r}")
