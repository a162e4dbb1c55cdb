"""Process-wide frontend settings, as in SGLang (`sgl.global_config`). Programs may also pass a backend
explicitly (`run(backend=...)`), which is preferred over the default set here (resolve_backend)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class GlobalConfig:
    verbosity: int = 0
    default_backend: Optional[Any] = None  # set by set_default_backend
    skip_special_tokens_in_output: bool = True
    spaces_between_special_tokens_in_out: bool = True
    # Frontend hints (switch off for the paper's ablation):
    enable_fork_prefix_hint: bool = True  # fork(n>1) prefills the shared prefix once before the branches
    enable_precache_with_tracing: bool = True  # run_batch caches the program's traced constant prefix
    precache_min_chars: int = 64  # a shorter traced prefix is not worth a request
    enable_parallel_encoding: bool = True  # KV-level concate_and_append where a backend supports it


global_config = GlobalConfig()


def resolve_backend(backend: Optional[Any], config: GlobalConfig = global_config) -> Any:
    """The backend a program runs on: the one passed, else the default (a Runtime stands for its endpoint)."""
    backend = backend if backend is not None else config.default_backend
    if backend is None:
        raise ValueError("no backend: call sgl.set_default_backend(...) or pass backend=")
    return getattr(backend, "endpoint", backend)
