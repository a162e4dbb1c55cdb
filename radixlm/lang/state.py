"""ProgramState (the `s` of a program and what `run` returns) and ProgramStateGroup (what `fork` returns)."""
from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Union

from radixlm.lang.interpreter import StreamExecutor, merge_stream_meta
from radixlm.lang.ir import (SglConcateAndAppend, SglExpr, SglExprList, SglRoleBegin, SglRoleEnd,
                             SglVarScopeBegin, SglVarScopeEnd, as_expr)


class RoleMethods:
    """`s.system(expr)` appends a whole turn; `with s.system():` opens one. Subclasses define _role_common."""

    def system(self, expr: Any = None):
        return self._role_common("system", expr)

    def user(self, expr: Any = None):
        return self._role_common("user", expr)

    def assistant(self, expr: Any = None):
        return self._role_common("assistant", expr)


class ProgramState(RoleMethods):
    def __init__(self, stream_executor: StreamExecutor) -> None:
        self.stream_executor = stream_executor
        self.ret_value: Any = None  # set by run: what the program function returned

    # ---- building
    def __iadd__(self, other: Any) -> "ProgramState":
        self.stream_executor.submit(other)
        return self

    def _role_common(self, role: str, expr: Any = None):
        if expr is not None:
            role_expr = SglExprList([SglRoleBegin(role), as_expr(expr), SglRoleEnd(role)])
            self.stream_executor.submit(role_expr)
            return role_expr
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.stream_executor.submit(SglRoleBegin(role))
        yield
        self.stream_executor.submit(SglRoleEnd(role))

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block becomes variable `name` as well."""
        self.stream_executor.submit(SglVarScopeBegin(name))
        yield
        self.stream_executor.submit(SglVarScopeEnd(name))

    def fork(self, size: int = 1, position_ids_offset: Optional[list[int]] = None) -> "ProgramStateGroup":
        children = self.stream_executor.fork(size, position_ids_offset)
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    @contextmanager
    def copy(self, position_ids_offset: Optional[list[int]] = None) -> Iterator["ProgramState"]:
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            group.join()

    # ---- reading (these block until the values exist, and raise the stream's error)
    def __getitem__(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        return self.stream_executor.get_meta_info(name)

    def text(self) -> str:
        return self.stream_executor.text()

    def messages(self) -> list[dict]:
        return self.stream_executor.messages()

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> Optional[BaseException]:
        """The stream's error once everything submitted so far has run (None if it succeeded)."""
        return self.stream_executor.wait_error()

    # ---- streaming
    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        exe = self.stream_executor
        if not exe.stream:
            yield self.text() if var_name is None else self.get_var(var_name)  # the value as it is (a list for n > 1)
            return
        if var_name is None:
            pos = 0
            while True:
                chunk, ended = exe.wait_text(pos)
                pos += len(chunk)
                if chunk:
                    yield chunk
                if ended:
                    exe.raise_if_error()
                    return
        idx = 0
        while True:
            pieces, done = exe.wait_var_chunks(var_name, idx)
            idx += len(pieces)
            for piece, _ in pieces:
                if piece:
                    yield piece
            if done:
                exe.raise_if_error()
                return

    async def text_async_iter(self, var_name: Optional[str] = None,
                              return_meta_data: bool = False) -> AsyncIterator[Union[str, tuple[str, dict]]]:
        """Like text_iter, without blocking the event loop. With return_meta_data (needs var_name) it yields
        (chunk, meta_info) where the logprob lists cover exactly this chunk's tokens."""
        exe = self.stream_executor
        if not exe.stream:
            if var_name is None:
                yield await asyncio.to_thread(self.text)
            else:
                val = await asyncio.to_thread(self.get_var, var_name)
                yield (val, exe.meta_info.get(var_name) or {}) if return_meta_data else val
            return
        if var_name is None:
            pos = 0
            while True:
                chunk, ended = await asyncio.to_thread(exe.wait_text, pos)
                pos += len(chunk)
                if chunk:
                    yield chunk
                if ended:
                    exe.raise_if_error()
                    return
        idx, pending = 0, None
        while True:
            pieces, done = await asyncio.to_thread(exe.wait_var_chunks, var_name, idx)
            idx += len(pieces)
            for piece, meta in pieces:
                # Chunks without text (e.g. a token that completes no character yet) pass their meta forward.
                pending = merge_stream_meta(pending, meta)
                if piece:
                    yield (piece, pending) if return_meta_data else piece
                    pending = None
            if done:
                exe.raise_if_error()
                return

    def __del__(self) -> None:
        try:
            self.stream_executor.end()
        except Exception:  # interpreter shutdown: nothing left to release
            pass

    def __repr__(self) -> str:
        # As SGLang: the whole text, once what was submitted has run (an error is shown, not raised).
        exe = self.stream_executor
        err = exe.wait_error()
        return f"ProgramState({exe.text_})" if err is None else f"ProgramState({exe.text_}, error={err!r})"


class BranchGroup:
    """What `fork` returns, in the interpreter and in the tracer: `forks[i] += expr` appends to one branch and
    `forks += x` to all of them (a callable gets each branch's index, a list or tuple gives one item per branch,
    anything else goes to every branch). Subclasses hold the branches in `states` and define join."""

    states: list

    def __iadd__(self, other: Union[Callable[[int], Any], SglExpr, str, list, tuple]) -> "BranchGroup":
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"forks += a list needs one item per branch: {len(other)} items for "
                                 f"{len(self.states)} branches")
            for st, item in zip(self.states, other):
                st += item
        elif callable(other) and not isinstance(other, SglExpr):
            for i, st in enumerate(self.states):
                st += other(i)
        else:
            for st in self.states:
                st += other
        return self

    def __getitem__(self, i: int) -> Any:
        return self.states[i]

    def __setitem__(self, i: int, value: Any) -> None:
        # `forks[i] += expr` appends through the branch's own __iadd__, then stores the branch back here.
        if value is not self.states[i]:
            raise ValueError("a fork's branch cannot be replaced; append to it with `forks[i] += ...`")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.states)


class ProgramStateGroup(BranchGroup):
    def __init__(self, states: list[ProgramState], src_state: Optional[ProgramState] = None) -> None:
        self.states = states
        self.src_state = src_state

    def join(self, mode: str = "gather_variable") -> None:
        """Brings the branches back into the parent, then ends their streams (their variables and text stay
        readable; nothing more can be appended to them)."""
        if self.src_state is None:
            raise ValueError("this group has no parent state to join into")
        if mode == "gather_variable":
            self._gather_variables()
        elif mode == "concate_and_append":
            self.src_state += SglConcateAndAppend(self.states)
        else:
            raise ValueError(f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}")
        for st in self.states:
            st.stream_executor.end()

    def _gather_variables(self) -> None:
        # Variables created in the branches come back to the parent as lists, one entry per branch.
        parent = self.src_state.stream_executor
        known = set(parent.variables)
        for st in self.states:
            st.stream_executor.sync()
        for st in self.states:
            for k, v in st.stream_executor.variables.items():
                if k in known:
                    continue
                cur = parent.variables.get(k)
                parent.set_var(k, (cur if isinstance(cur, list) else []) + [v])
