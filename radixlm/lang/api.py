"""The public primitives (`sgl.function`, `sgl.gen`, `sgl.select`, roles ...), with SGLang's signatures."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional, Union

from radixlm.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.global_config import global_config, resolve_backend
from radixlm.lang.program import SglFunction
from radixlm.lang.ir import (SglExpr, SglExprList, SglGen, SglImage, SglRoleBegin, SglRoleEnd, SglSamplingParams,
                             SglSelect, SglSeparateReasoning, SglVideo, as_expr, normalize_dtype)
from radixlm.lang.reasoning import reasoning_parser


def function(func: Optional[Callable] = None, num_api_spec_tokens: Optional[int] = None):
    """`@sgl.function` or `@sgl.function(num_api_spec_tokens=N)`."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)


def set_default_backend(backend: Any) -> None:
    global_config.default_backend = backend


def flush_cache(backend: Any = None, empty_cache: bool = True) -> Any:
    """Flushes the backend's prefix cache; False when there is no backend (as SGLang). `empty_cache` is taken for
    SGLang's signature: radixlm's /flush_cache has no such option."""
    if backend is None and global_config.default_backend is None:
        return False
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> Any:
    """The server's info; None when there is no backend (as SGLang)."""
    if backend is None and global_config.default_backend is None:
        return None
    return resolve_backend(backend).get_server_info()


def _check_positive(name: str, v: Optional[int], minimum: int) -> None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < minimum):
        raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")


def gen(name: Optional[str] = None, max_tokens: Optional[int] = None, min_tokens: Optional[int] = None,
        n: Optional[int] = None, stop: Optional[Union[str, list[str]]] = None,
        stop_token_ids: Optional[list[int]] = None, stop_regex: Optional[Union[str, list[str]]] = None,
        temperature: Optional[float] = None, top_p: Optional[float] = None, top_k: Optional[int] = None,
        min_p: Optional[float] = None, frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None, ignore_eos: Optional[bool] = None,
        return_logprob: Optional[bool] = None, logprob_start_len: Optional[int] = None,
        top_logprobs_num: Optional[int] = None, return_text_in_logprobs: Optional[bool] = None,
        dtype: Optional[Union[type, str]] = None, choices: Optional[list[str]] = None,
        choices_method: Optional[ChoicesSamplingMethod] = None, regex: Optional[str] = None,
        json_schema: Optional[str] = None, priority: Optional[int] = None) -> SglExpr:
    """Generate into variable `name`. With `choices` this is a `select`. `None` inherits the run's default.
    priority: the request's priority on a server with priority scheduling (RuntimeEndpoint)."""
    if choices:
        return SglSelect(name, list(choices), 0.0 if temperature is None else temperature,
                         token_length_normalized if choices_method is None else choices_method)
    if choices is not None:
        raise ValueError("choices must not be empty")
    _check_positive("max_tokens", max_tokens, 0)
    _check_positive("min_tokens", min_tokens, 0)
    _check_positive("n", n, 1)
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"invalid regex {regex!r}: {e}") from None
    if json_schema is not None and not isinstance(json_schema, str):
        raise TypeError("json_schema must be a JSON string (use json.dumps on a dict)")
    sp = SglSamplingParams(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids,
        stop_regex=stop_regex, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, ignore_eos=ignore_eos,
        return_logprob=return_logprob, logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs, json_schema=json_schema, dtype=normalize_dtype(dtype),
        regex=regex, priority=priority)
    return SglGen(name, sp)


def gen_int(name: Optional[str] = None, max_tokens: Optional[int] = None, n: Optional[int] = None,
            stop: Optional[Union[str, list[str]]] = None, stop_token_ids: Optional[list[int]] = None,
            stop_regex: Optional[Union[str, list[str]]] = None, temperature: Optional[float] = None,
            top_p: Optional[float] = None, top_k: Optional[int] = None, min_p: Optional[float] = None,
            frequency_penalty: Optional[float] = None, presence_penalty: Optional[float] = None,
            ignore_eos: Optional[bool] = None, return_logprob: Optional[bool] = None,
            logprob_start_len: Optional[int] = None, top_logprobs_num: Optional[int] = None,
            return_text_in_logprobs: Optional[bool] = None) -> SglExpr:
    return gen(name, max_tokens, None, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
               frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
               top_logprobs_num, return_text_in_logprobs, dtype=int)


def gen_string(name: Optional[str] = None, max_tokens: Optional[int] = None, n: Optional[int] = None,
               stop: Optional[Union[str, list[str]]] = None, stop_token_ids: Optional[list[int]] = None,
               stop_regex: Optional[Union[str, list[str]]] = None, temperature: Optional[float] = None,
               top_p: Optional[float] = None, top_k: Optional[int] = None, min_p: Optional[float] = None,
               frequency_penalty: Optional[float] = None, presence_penalty: Optional[float] = None,
               ignore_eos: Optional[bool] = None, return_logprob: Optional[bool] = None,
               logprob_start_len: Optional[int] = None, top_logprobs_num: Optional[int] = None,
               return_text_in_logprobs: Optional[bool] = None) -> SglExpr:
    return gen(name, max_tokens, None, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
               frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
               top_logprobs_num, return_text_in_logprobs, dtype=str)


def select(name: Optional[str] = None, choices: Optional[list[str]] = None, temperature: float = 0.0,
           choices_method: ChoicesSamplingMethod = token_length_normalized) -> SglExpr:
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    if not all(isinstance(c, str) for c in choices):
        raise TypeError("select choices must be strings")
    if not isinstance(choices_method, ChoicesSamplingMethod):
        raise TypeError(f"choices_method must be a ChoicesSamplingMethod such as sgl.token_length_normalized, "
                        f"got {choices_method!r}")
    return SglSelect(name, list(choices), temperature, choices_method)


def separate_reasoning(expr: Any = None, model_type: Optional[str] = None) -> SglExpr:
    """`expr` (a named gen or select), then split its output: the answer stays under its name, the reasoning
    goes to `<name>_reasoning_content`. `model_type` names the think format ("deepseek-r1", "qwen3", ...)."""
    if expr is None:
        raise ValueError("separate_reasoning needs the gen (or select) whose output it splits")
    reasoning_parser(model_type)
    expr = as_expr(expr)
    return SglExprList([expr, SglSeparateReasoning(model_type, expr)])


def image(expr: Union[str, bytes]) -> SglExpr:
    return SglImage(expr)


def video(path: str, num_frames: int) -> SglExpr:
    return SglVideo(path, num_frames)


def _role(role: str, expr: Any) -> SglExpr:
    if expr is None:
        return SglExprList([SglRoleBegin(role), SglRoleEnd(role)])
    return SglExprList([SglRoleBegin(role), as_expr(expr), SglRoleEnd(role)])


def system(expr: Any = None) -> SglExpr:
    return _role("system", expr)


def user(expr: Any = None) -> SglExpr:
    return _role("user", expr)


def assistant(expr: Any = None) -> SglExpr:
    return _role("assistant", expr)


def system_begin() -> SglExpr:
    return SglRoleBegin("system")


def system_end() -> SglExpr:
    return SglRoleEnd("system")


def user_begin() -> SglExpr:
    return SglRoleBegin("user")


def user_end() -> SglExpr:
    return SglRoleEnd("user")


def assistant_begin() -> SglExpr:
    return SglRoleBegin("assistant")


def assistant_end() -> SglExpr:
    return SglRoleEnd("assistant")
