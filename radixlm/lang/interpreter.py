"""The interpreter: one StreamExecutor per program state (paper §2).

Primitives are submitted to the executor's queue and return at once; its worker thread executes them in order.
Fetching a variable blocks until the primitive that sets it has run. An error in the worker is kept in `error_`,
releases every waiter, skips the rest of the queue, and is raised (as ProgramError) by every later fetch."""
from __future__ import annotations

import queue
import threading
import uuid
from typing import TYPE_CHECKING, Any, Optional

from radixlm.lang.media import b64encode, image_bytes, media_bytes
from radixlm.lang.chat_template import ChatTemplate, message_content
from radixlm.lang.global_config import GlobalConfig, global_config
from radixlm.lang.ir import (SglCommitLazy, SglConcateAndAppend, SglConstantText, SglExpr, SglExprList, SglGen,
                             SglImage, SglRoleBegin, SglRoleEnd, SglSamplingParams, SglSelect, SglSeparateReasoning,
                             SglVariable, SglVarScopeBegin, SglVarScopeEnd, SglVideo, _as_list, as_expr)
from radixlm.lang.reasoning import execute_separate_reasoning
from radixlm.lang.speculative import ApiSpeculation

if TYPE_CHECKING:
    from radixlm.lang.backend.base_backend import BaseBackend

_LIST_META = ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs")


class ProgramError(RuntimeError):
    """A primitive failed while the stream executed it; `__cause__` is the original exception."""


def merge_stream_meta(acc: Optional[dict], new: dict) -> dict:
    """Accumulates per-chunk meta_info: logprob lists are concatenated, other fields take the newest value."""
    out = dict(acc or {})
    for k, v in new.items():
        if k in _LIST_META and isinstance(v, list):
            out[k] = list(out.get(k) or []) + v
        else:
            out[k] = v
    return out


class StreamExecutor:
    def __init__(self, backend: "BaseBackend", arguments: dict[str, Any], default_sampling_para: SglSamplingParams,
                 chat_template: Optional[ChatTemplate], stream: bool, num_api_spec_tokens: Optional[int] = None,
                 use_thread: bool = True, config: GlobalConfig = global_config) -> None:
        self.sid = uuid.uuid4().hex
        self.backend = backend
        self.arguments = arguments
        self.default_sampling_para = default_sampling_para
        self.stream = stream
        self.config = config
        self.chat_template = chat_template or backend.get_chat_template()
        self.num_api_spec_tokens = num_api_spec_tokens
        self.spec: Optional[ApiSpeculation] = None  # API speculative execution (paper §5), where supported
        if num_api_spec_tokens and backend.supports_api_speculation:
            self.spec = ApiSpeculation(num_api_spec_tokens, is_chat=bool(getattr(backend, "is_chat_model", False)))

        # Program state, written by the worker thread (fork/join copy it after a sync).
        self.text_ = ""
        self.messages_: list[dict] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.images_: list[tuple[Any, str]] = []  # (source, base64 data)
        self.videos_: list[tuple[Any, str]] = []  # (source, data URL with its num_frames)
        self.cur_role: Optional[str] = None
        self.cur_role_begin_pos: Optional[int] = None
        self.cur_role_images: list[tuple[int, str, str]] = []  # (text position of its token, part type, data URL)
        self.variables_scope_start: dict[str, int] = {}
        self.fork_start_text_pos: int = 0  # set by fork: where a child's own text begins
        self.error_: Optional[BaseException] = None
        self.is_finished = False

        # Synchronization. NOTE: every change that a streaming reader or a variable waiter observes happens under
        # `cond` followed by notify_all, so waiting with cond.wait_for never misses an update.
        self.cond = threading.Condition()
        self.variable_event: dict[str, threading.Event] = {}
        # Outputs a separate_reasoning will rewrite: their waiters are released by it, not by the gen.
        self.deferred_vars: set[str] = set()
        self.stream_chunks: dict[str, list[tuple[str, dict]]] = {}  # var -> streamed (text, meta delta) pieces
        self._ended = False
        self.use_thread = use_thread
        if use_thread:
            self.queue: queue.Queue = queue.Queue()
            self.worker = threading.Thread(target=self._thread_worker_func, daemon=True,
                                           name=f"sgl-stream-{self.sid[:8]}")
            self.worker.start()
        backend.begin_program(self)

    # ---- submitting and fetching (called from the program's thread)
    def submit(self, expr: Any) -> None:
        expr = as_expr(expr)
        if self._ended:
            raise RuntimeError("this program state has ended; no more primitives can be appended")
        self._init_var_events(expr)
        if self.use_thread:
            self.queue.put(expr)
        else:
            self._run_one(expr)

    def sync(self) -> None:
        """Waits until everything submitted so far has run; raises the stream's error if there was one."""
        if self.use_thread:
            self.queue.join()
        self.raise_if_error()

    def wait_error(self) -> Optional[BaseException]:
        """Waits like sync(), but returns the stream's error (None if there is none) instead of raising it."""
        if self.use_thread:
            self.queue.join()
        return self.error_

    def raise_if_error(self) -> None:
        if self.error_ is not None:
            e = self.error_
            raise ProgramError(f"the program failed: {type(e).__name__}: {e}") from e

    def get_var(self, name: str) -> Any:
        ev = self.variable_event.get(name)
        if ev is not None:
            ev.wait()
        if name in self.variables:
            return self.variables[name]
        self.raise_if_error()
        raise KeyError(f"variable {name!r} is not set (no gen/select/var_scope of that name was appended)")

    def set_var(self, name: str, value: Any) -> None:
        with self.cond:
            self.variables[name] = value
            self.cond.notify_all()

    def get_meta_info(self, name: str) -> Any:
        self.get_var(name)
        return self.meta_info.get(name)

    def text(self) -> str:
        self.sync()
        return self.text_

    def messages(self) -> list[dict]:
        self.sync()
        return self.messages_

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self.use_thread:
            self.queue.put(None)
        else:
            self._finish()
        self.backend.end_program(self)

    def fork(self, size: int = 1, position_ids_offset: Optional[list[int]] = None) -> list["StreamExecutor"]:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"fork size must be a positive int, got {size!r}")
        if size > 1 and self.config.enable_fork_prefix_hint:
            self.submit(SglCommitLazy())
        self.sync()
        children = []
        for _ in range(size):
            child = StreamExecutor(self.backend, self.arguments, self.default_sampling_para, self.chat_template,
                                   self.stream, use_thread=self.use_thread, config=self.config)
            child.variables = dict(self.variables)
            child.meta_info = dict(self.meta_info)
            child.text_ = self.text_
            child.messages_ = list(self.messages_)
            child.images_, child.videos_ = list(self.images_), list(self.videos_)
            child.cur_role = self.cur_role
            child.cur_role_begin_pos = self.cur_role_begin_pos
            child.fork_start_text_pos = len(self.text_)
            children.append(child)
        return children

    # ---- streaming readers
    def wait_text(self, pos: int) -> tuple[str, bool]:
        """Blocks until the text grows past `pos` or the stream ends; returns (text[pos:], ended)."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.text_) > pos or self.is_finished)
            return self.text_[pos:], self.is_finished

    def wait_var_chunks(self, name: str, idx: int) -> tuple[list[tuple[str, dict]], bool]:
        """Blocks until variable `name` has streamed pieces past `idx` or is complete; returns (new pieces, done).
        A variable that was not streamed (a select, a var_scope, a non-stream gen) comes as one piece."""
        def done() -> bool:
            ev = self.variable_event.get(name)
            return (ev is not None and ev.is_set()) or self.is_finished

        with self.cond:
            self.cond.wait_for(lambda: len(self.stream_chunks.get(name, ())) > idx or done())
            chunks = self.stream_chunks.get(name)
            if chunks is not None:
                return chunks[idx:], done()
            if done() and name in self.variables and idx == 0:
                return [(str(self.variables[name]), self.meta_info.get(name) or {})], True
            return [], done()

    # ---- the worker
    def _init_var_events(self, expr: SglExpr) -> None:
        if isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._init_var_events(e)
        elif isinstance(expr, (SglGen, SglSelect, SglVarScopeBegin)) and expr.name is not None:
            self._new_var_event(expr.name)
        elif isinstance(expr, SglSeparateReasoning) and not self.stream:
            for name in expr.names:
                self._new_var_event(expr.reasoning_name(name))
            with self.cond:
                self.deferred_vars.update(expr.names)

    def _new_var_event(self, name: str) -> None:
        with self.cond:
            self.variable_event[name] = threading.Event()
            self.stream_chunks.pop(name, None)
            self.cond.notify_all()

    def _thread_worker_func(self) -> None:
        while True:
            expr = self.queue.get()
            try:
                if expr is None:
                    self._finish()
                    return
                self._run_one(expr)
            finally:
                self.queue.task_done()

    def _run_one(self, expr: SglExpr) -> None:
        if self.error_ is not None:
            return
        try:
            self._execute(expr)
        except Exception as e:  # kept for the caller; see the module docstring
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        with self.cond:
            self.error_ = e
            self.is_finished = True
            for ev in self.variable_event.values():
                ev.set()
            self.cond.notify_all()

    def _finish(self) -> None:
        with self.cond:
            self.is_finished = True
            self.cond.notify_all()

    def _append_text(self, text: str) -> None:
        with self.cond:
            self.text_ += text
            self.cond.notify_all()

    def _set_var_done(self, name: Optional[str], value: Any, meta: Any = None) -> None:
        if name is None:
            return
        with self.cond:
            self.variables[name] = value
            if meta is not None:
                self.meta_info[name] = meta
            ev = self.variable_event.setdefault(name, threading.Event())
            if name not in self.deferred_vars:
                ev.set()
            self.cond.notify_all()

    def finish_deferred_var(self, name: str, value: Any) -> None:
        with self.cond:
            self.deferred_vars.discard(name)
        self._set_var_done(name, value)

    def replace_last_text(self, old: str, new: str) -> None:
        with self.cond:
            i = self.text_.rfind(old)
            if i >= 0:
                self.text_ = self.text_[:i] + new + self.text_[i + len(old):]
            self.cond.notify_all()

    def _execute(self, expr: SglExpr) -> None:
        if self.spec is not None and self.spec.intercept(self, expr):
            return
        if isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._execute(e)
        elif isinstance(expr, SglConstantText):
            self._append_text(expr.value)
        elif isinstance(expr, SglGen):
            self._execute_gen(expr)
        elif isinstance(expr, SglSelect):
            self._execute_select(expr)
        elif isinstance(expr, SglRoleBegin):
            self._execute_role_begin(expr)
        elif isinstance(expr, SglRoleEnd):
            self._execute_role_end(expr)
        elif isinstance(expr, SglImage):
            self._execute_image(expr)
        elif isinstance(expr, SglVideo):
            self._execute_video(expr)
        elif isinstance(expr, SglVariable):
            self._append_text(str(expr.source.get_var(expr.name)))
        elif isinstance(expr, SglVarScopeBegin):
            self.variables_scope_start[expr.name] = len(self.text_)
        elif isinstance(expr, SglVarScopeEnd):
            if expr.name not in self.variables_scope_start:
                raise ValueError(f"var_scope {expr.name!r} ends without having begun")
            self._set_var_done(expr.name, self.text_[self.variables_scope_start.pop(expr.name):])
        elif isinstance(expr, SglCommitLazy):
            self.backend.commit_lazy_operations(self)
        elif isinstance(expr, SglConcateAndAppend):
            self._execute_concatenate_and_append(expr)
        elif isinstance(expr, SglSeparateReasoning):
            execute_separate_reasoning(self, expr)
        else:
            raise TypeError(f"the interpreter cannot execute {expr!r}")

    def _resolve_sampling_params(self, sp: SglSamplingParams) -> SglSamplingParams:
        out = self.default_sampling_para.merged_with(sp)
        stop = _as_list(out.stop)
        out.stop = stop + [x for x in self.chat_template.stop_str if x not in stop]
        return out

    def _execute_gen(self, expr: SglGen) -> None:
        sp = self._resolve_sampling_params(expr.sampling_params)
        if not self.stream:
            comp, meta = self.backend.generate(self, sampling_params=sp)
            self._append_text(comp[0] if isinstance(comp, list) else comp)
            self._set_var_done(expr.name, comp, meta)
            return
        if sp.n != 1:
            raise ValueError("gen with n > 1 cannot be streamed")
        key = expr.name
        acc_text, acc_meta = "", None
        with self.cond:
            if key is not None:
                self.variables[key] = ""
                self.stream_chunks[key] = []
        for piece, meta in self.backend.generate_stream(self, sampling_params=sp):
            acc_text += piece
            acc_meta = merge_stream_meta(acc_meta, meta)
            with self.cond:
                self.text_ += piece
                if key is not None:
                    self.variables[key] = acc_text
                    self.meta_info[key] = acc_meta
                    self.stream_chunks[key].append((piece, meta))
                self.cond.notify_all()
        self._set_var_done(key, acc_text, acc_meta or {})

    def _execute_select(self, expr: SglSelect) -> None:
        decision = self.backend.select(self, expr.choices, expr.temperature, expr.choices_method)
        self._append_text(decision.decision)
        self._set_var_done(expr.name, decision.decision, decision.meta_info)

    def _execute_role_begin(self, expr: SglRoleBegin) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {expr.role!r} begins inside role {self.cur_role!r}: roles cannot nest")
        if not self.messages_ and expr.role != "system" and self.chat_template.default_system_prompt:
            self._execute_role_begin(SglRoleBegin("system"))
            self._append_text(self.chat_template.default_system_prompt)
            self._execute_role_end(SglRoleEnd("system"))
        prefix, _ = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._append_text(prefix)
        self.cur_role = expr.role
        self.cur_role_begin_pos = len(self.text_)
        self.cur_role_images = []

    def _execute_role_end(self, expr: SglRoleEnd) -> None:
        if self.cur_role != expr.role:
            raise ValueError(f"role {expr.role!r} ends but the open role is {self.cur_role!r}")
        content = message_content(self.text_, self.cur_role_begin_pos, self.cur_role_images, self.chat_template)
        _, suffix = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._append_text(suffix)
        self.messages_.append({"role": expr.role, "content": content})
        self.cur_role = None
        self.cur_role_begin_pos = None

    def _execute_image(self, expr: SglImage) -> None:
        b64 = b64encode(image_bytes(expr.path))
        self.images_.append((expr.path, b64))
        self.cur_role_images.append((len(self.text_), "image_url", f"data:image/png;base64,{b64}"))
        self._append_text(self.chat_template.image_token)

    def _execute_video(self, expr: SglVideo) -> None:
        # The frame count travels as a data URL parameter, which the server's media loader reads.
        url = f"data:video/mp4;num_frames={int(expr.num_frames)};base64,{b64encode(media_bytes(expr.path))}"
        self.videos_.append((expr.path, url))
        self.cur_role_images.append((len(self.text_), "video_url", url))
        self._append_text(self.chat_template.video_token)

    def _execute_concatenate_and_append(self, expr: SglConcateAndAppend) -> None:
        exes = [st.stream_executor for st in expr.states]
        for exe in exes:
            exe.sync()
        if self.backend.support_concate_and_append and self.config.enable_parallel_encoding:
            self.backend.concatenate_and_append([e.sid for e in exes], self.sid)
        self._append_text("".join(e.text_[e.fork_start_text_pos:] for e in exes))

