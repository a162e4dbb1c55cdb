"""radixlm: structured LM programs and a RadixAttention inference runtime.

`import radixlm as sgl` gives SGLang's frontend names. The import stays light: torch and the runtime load only
when Engine is first used, and backends when first named."""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LANG_NAMES = (
    "function", "gen", "gen_int", "gen_string", "select", "image", "video", "system", "user", "assistant",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end",
    "set_default_backend", "flush_cache", "get_server_info", "global_config", "token_length_normalized",
    "greedy_token_selection", "unconditional_likelihood_normalized", "ProgramState", "ProgramStateGroup",
    "ProgramError", "TracingError", "RuntimeEndpoint", "OpenAI", "Anthropic", "LiteLLM", "VertexAI", "Runtime",
    "separate_reasoning",
)
_LAZY = {
    "Engine": "radixlm.runtime.engine",
    "ServerArgs": "radixlm.runtime.args",
    "SamplingParams": "radixlm.runtime.sampling.sampling_params",
    **{n: "radixlm.lang" for n in _LANG_NAMES},
}
__all__ = ["Engine", "ServerArgs", "SamplingParams", *_LANG_NAMES]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
