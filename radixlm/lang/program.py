"""SglFunction (what `@sgl.function` returns) and the program runners `run_program` / `run_program_batch`."""
from __future__ import annotations

import functools
import inspect
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

from radixlm.lang.compiler import CompiledFunction
from radixlm.lang.global_config import GlobalConfig, global_config, resolve_backend
from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.ir import SglSamplingParams
from radixlm.lang.state import ProgramState
from radixlm.lang.tracer import TracedProgram, extract_prefix_by_tracing, trace_call, trace_program, tracing

if TYPE_CHECKING:
    from radixlm.lang.backend.base_backend import BaseBackend

_SAMPLING_KWARGS = ("max_new_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
                    "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob",
                    "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "priority")
GENERATOR_CHUNK = 200  # generator_style run_batch yields states in chunks of this many


class SglFunction:
    def __init__(self, func: Callable, num_api_spec_tokens: Optional[int] = None,
                 bind_arguments: Optional[dict[str, Any]] = None) -> None:
        if not callable(func):
            raise TypeError(f"sgl.function decorates a function, got {type(func).__name__}")
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.signature = inspect.signature(func)
        params = list(self.signature.parameters.values())
        if not params or params[0].name != "s":
            raise TypeError(f"the first parameter of an sgl.function must be named 's' "
                            f"({getattr(func, '__qualname__', func)!r})")
        self.arg_names = [p.name for p in params[1:]]
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> "SglFunction":
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise TypeError(f"{self.func.__name__}() has no parameter(s) {unknown}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def run(self, *args: Any, max_new_tokens: int = 128, n: int = 1, stop: Optional[Union[str, list[str]]] = None,
            stop_token_ids: Optional[list[int]] = None, stop_regex: Optional[Union[str, list[str]]] = None,
            temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0,
            frequency_penalty: float = 0.0, presence_penalty: float = 0.0, ignore_eos: bool = False,
            return_logprob: Optional[bool] = None, logprob_start_len: Optional[int] = None,
            top_logprobs_num: Optional[int] = None, return_text_in_logprobs: Optional[bool] = None,
            priority: Optional[int] = None, stream: bool = False, backend: Optional["BaseBackend"] = None, use_thread: bool = True,
            **kwargs: Any) -> ProgramState:
        sp = _default_sampling_params(locals())
        return run_program(self, resolve_backend(backend), args, kwargs, sp, stream, use_thread=use_thread)

    def run_batch(self, batch_kwargs: list[Union[dict, tuple, list]], *, max_new_tokens: int = 128, n: int = 1,
                  stop: Optional[Union[str, list[str]]] = None, stop_token_ids: Optional[list[int]] = None,
                  stop_regex: Optional[Union[str, list[str]]] = None, temperature: float = 1.0, top_p: float = 1.0,
                  top_k: int = -1, min_p: float = 0.0, frequency_penalty: float = 0.0,
                  presence_penalty: float = 0.0, ignore_eos: bool = False, return_logprob: Optional[bool] = None,
                  logprob_start_len: Optional[int] = None, top_logprobs_num: Optional[int] = None,
                  return_text_in_logprobs: Optional[bool] = None, priority: Optional[int] = None,
                  backend: Optional["BaseBackend"] = None, num_threads: Union[str, int] = "auto", progress_bar: bool = False,
                  generator_style: bool = False) -> Union[list[ProgramState], Iterator[ProgramState]]:
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of argument dicts (or of positional tuples)")
        items = [self._as_kwargs(i, item) for i, item in enumerate(batch_kwargs)]
        sp = _default_sampling_params(locals())
        return run_program_batch(self, resolve_backend(backend), items, sp, num_threads=num_threads,
                                 progress_bar=progress_bar, generator_style=generator_style)

    def _as_kwargs(self, i: int, item: Union[dict, tuple, list]) -> dict:
        if isinstance(item, dict):
            return item
        if isinstance(item, (tuple, list)):
            if len(item) > len(self.arg_names):
                raise TypeError(f"batch item {i} has {len(item)} positional arguments; "
                                f"{self.func.__name__} takes {len(self.arg_names)}")
            return dict(zip(self.arg_names, item))
        raise TypeError(f"batch item {i} must be a dict or a tuple, got {type(item).__name__}")

    def trace(self, *, backend: Optional["BaseBackend"] = None, **kwargs: Any) -> TracedProgram:
        """The program's IR graph; kwargs bind parameters, the others stay abstract."""
        return trace_program(self, kwargs, backend)

    def compile(self, *, backend: Optional["BaseBackend"] = None, **kwargs: Any) -> CompiledFunction:
        """The traced graph, run by the graph executor."""
        return CompiledFunction(self.trace(backend=backend, **kwargs), backend)

    def cache(self, backend: Optional["BaseBackend"] = None) -> Optional[str]:
        """Prefills the program's constant prefix on the backend; returns it (None if it is too short)."""
        return precache_constant_prefix(self, resolve_backend(backend), force=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A program called inside another runs as its own program (its own stream), as in SGLang; while the caller
        # is traced (trace/compile), the callee is traced into the caller's graph as a stream of its own.
        if tracing():
            return trace_call(self, args, kwargs)
        return self.run(*args, **kwargs)


def _default_sampling_params(scope: dict) -> SglSamplingParams:
    vals = {k: scope[k] for k in _SAMPLING_KWARGS}
    vals["stop"] = [] if vals["stop"] is None else vals["stop"]
    vals["stop_token_ids"] = [] if vals["stop_token_ids"] is None else vals["stop_token_ids"]
    vals["stop_regex"] = [] if vals["stop_regex"] is None else vals["stop_regex"]
    return SglSamplingParams(**vals)


def run_program(program: SglFunction, backend: "BaseBackend", func_args: tuple, func_kwargs: dict,
                default_sampling_para: SglSamplingParams, stream: bool, sync: bool = False,
                use_thread: bool = True) -> ProgramState:
    kwargs = {**program.bind_arguments, **func_kwargs}
    try:
        program.signature.bind(None, *func_args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{program.func.__name__}: {e}") from None
    executor = StreamExecutor(backend, kwargs, default_sampling_para, chat_template=None, stream=stream,
                              num_api_spec_tokens=program.num_api_spec_tokens, use_thread=use_thread)
    state = ProgramState(executor)

    def body() -> None:
        try:
            state.ret_value = program.func(state, *func_args, **kwargs)
        finally:
            executor.end()
        if global_config.verbosity >= 2:  # as SGLang: each finished run prints its text
            executor.wait_error()
            print(executor.text_)

    if stream:
        def body_in_thread() -> None:
            try:
                body()
            except Exception as e:  # surfaced by the state's readers (text_iter, s[...], text())
                executor._fail(e)

        threading.Thread(target=body_in_thread, daemon=True, name=f"sgl-program-{executor.sid[:8]}").start()
        return state
    body()
    if sync and use_thread:
        executor.queue.join()
    return state


def run_program_batch(program: SglFunction, backend: "BaseBackend", batch: list[dict],
                      default_sampling_para: SglSamplingParams, num_threads: Union[str, int] = "auto",
                      progress_bar: bool = False, generator_style: bool = False,
                      config: GlobalConfig = global_config) -> Union[list[ProgramState], Iterator[ProgramState]]:
    """Runs the program once per item on a thread pool. A program body that raises makes run_batch raise; a
    primitive that fails leaves its state with error() set (its fetches raise)."""
    if num_threads == "auto":
        num_threads = max(96, (os.cpu_count() or 1) * 16)
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")
    num_threads = max(1, min(num_threads, len(batch)))
    if len(batch) > 1 and config.enable_precache_with_tracing:
        precache_constant_prefix(program, backend)

    def one(kwargs: dict) -> ProgramState:
        return run_program(program, backend, (), kwargs, default_sampling_para, stream=False, sync=True)

    def run_chunk(chunk: list[dict], bar: Any) -> list[ProgramState]:
        with ThreadPoolExecutor(num_threads) as pool:
            futures = [pool.submit(one, kw) for kw in chunk]
            if bar is not None:
                for f in futures:
                    f.add_done_callback(lambda _: bar.update(1))
            return [f.result() for f in futures]

    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(batch))

    if generator_style:
        def gen() -> Iterator[ProgramState]:
            try:
                for i in range(0, len(batch), GENERATOR_CHUNK):
                    yield from run_chunk(batch[i:i + GENERATOR_CHUNK], bar)
            finally:
                if bar is not None:
                    bar.close()
        return gen()
    try:
        return run_chunk(batch, bar)
    finally:
        if bar is not None:
            bar.close()


def precache_constant_prefix(program: SglFunction, backend: "BaseBackend", force: bool = False,
                             config: GlobalConfig = global_config) -> Optional[str]:
    """The run_batch prefix hint: trace the program's constant prefix and prefill it once, so that the batch's
    first items already find it cached instead of all prefilling it at the same time."""
    prefix = extract_prefix_by_tracing(program, backend)
    if prefix and (force or len(prefix) > config.precache_min_chars):
        backend.cache_prefix(prefix)
        return prefix
    return None
