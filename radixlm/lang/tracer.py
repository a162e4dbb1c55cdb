"""Tracing (paper Appendix D): run a program once with abstract arguments and record the IR graph it builds.

Every `s += ...` records nodes on the stream of `s`; `fork` opens one stream per branch, and so does a call of
another sgl.function; `s["x"]` records a reference to the stream that defines `x` (an inter-stream edge when that is
another stream). Python control flow
runs at trace time, so only programs whose control flow does not depend on arguments or generated values can be
traced: using a traced value as a bool, comparing, iterating or formatting it raises TracingError naming the
program's line."""
from __future__ import annotations

import contextvars
import copy
import heapq
import inspect
import linecache
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol

from radixlm.lang.graph_text import describe_node
from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.ir import (SglArgument, SglConstantText, SglExpr, SglExprList, SglFork, SglGen, SglGetForkItem,
                             SglJoin, SglRoleBegin, SglRoleEnd, SglSamplingParams, SglSelect, SglSeparateReasoning,
                             SglVariable, SglVarScopeBegin, SglVarScopeEnd, _node_ids, as_expr)
from radixlm.lang.state import BranchGroup, RoleMethods

if TYPE_CHECKING:
    from radixlm.lang.backend.base_backend import BaseBackend

_LANG_DIR = os.path.dirname(os.path.abspath(__file__))


class TracingError(TypeError, RuntimeError):
    """The program cannot be traced (data-dependent control flow, formatting a traced value ...); a TypeError."""


_TRACING: contextvars.ContextVar[Optional["TracedProgram"]] = contextvars.ContextVar("radixlm_tracing", default=None)


class Traceable(Protocol):
    """What tracing and the graph executor read of an SglFunction (program.py, which imports this module)."""

    func: Callable[..., Any]
    arg_names: list[str]
    bind_arguments: dict[str, Any]
    num_api_spec_tokens: Optional[int]


def _user_location() -> str:
    """`file:line: source` of the innermost frame outside radixlm.lang (the program's line)."""
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _LANG_DIR:
        f = f.f_back
    if f is None:
        return "<unknown line>"
    src = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return f"{f.f_code.co_filename}:{f.f_lineno} (in {f.f_code.co_name}): {src}"


def _refuse(what: str) -> Callable:
    def guard(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise TracingError(f"cannot trace {what} of {self.describe()}: its value is unknown while tracing, so "
                           f"the program's control flow or text must not depend on it.\n  at {_user_location()}")
    return guard


class _Traced:
    """Guards of a traced value. `+` with strings and primitives stays allowed (SglExpr's operators)."""

    __bool__ = _refuse("bool() (data-dependent control flow)")
    __eq__ = _refuse("a comparison (data-dependent control flow)")
    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __iter__ = _refuse("iterating over the value")
    __len__ = _refuse("len()")
    __contains__ = _refuse("`in`")
    __getitem__ = _refuse("indexing")
    __str__ = _refuse("str() (use `+` to concatenate it with text instead of str()/f-strings/%)")
    __format__ = _refuse("f-string formatting (use `+` to concatenate it with text)")
    __int__ = __float__ = __index__ = _refuse("a number conversion")
    __hash__ = object.__hash__

    def describe(self) -> str:
        raise NotImplementedError


class TracedArgument(_Traced, SglArgument):
    def describe(self) -> str:
        return f"argument {self.name!r}"


class TracedVariable(_Traced, SglVariable):
    def describe(self) -> str:
        return f"variable {self.name!r}"


class TracerProgramState(RoleMethods):
    """The `s` a program sees while it is traced: one stream of the graph."""

    def __init__(self, graph: "TracedProgram", defined: dict[str, int], label: str) -> None:
        self.graph = graph
        self.pid = len(graph.streams)
        self.label = label
        self.nodes: list[SglExpr] = []
        self.defined = dict(defined)  # variable -> pid of the stream whose node sets it (inherited by forks)
        self.own_vars: list[str] = []  # variables this stream set itself
        self.ret_value: Any = None
        graph.streams.append(self)

    def _record(self, expr: SglExpr) -> None:
        if isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._record(e)
            return
        # A node object may be appended more than once (a shared argument, a reused primitive); each occurrence
        # is its own graph node.
        if isinstance(expr, TracedArgument):
            node: SglExpr = SglArgument(expr.name)
        elif isinstance(expr, TracedVariable):
            node = SglVariable(expr.name, expr.source)
        else:
            node = copy.copy(expr)
            node.node_id = next(_node_ids)
        node.pid = self.pid
        node.prev_node = self.nodes[-1] if self.nodes else None
        self.nodes.append(node)
        self.graph.nodes.append(node)
        name = getattr(node, "name", None)
        if isinstance(node, (SglGen, SglSelect, SglVarScopeEnd)) and name is not None:
            self._define(name)
        elif isinstance(node, SglSeparateReasoning):
            for n in node.names:
                self._define(n)
                self._define(node.reasoning_name(n))

    def _define(self, name: str) -> None:
        self.defined[name] = self.pid
        if name not in self.own_vars:
            self.own_vars.append(name)

    def __iadd__(self, other: Any) -> "TracerProgramState":
        self._record(as_expr(other))
        return self

    def _role_common(self, role: str, expr: Any = None):
        if expr is not None:
            self._record(SglExprList([SglRoleBegin(role), as_expr(expr), SglRoleEnd(role)]))
            return None
        return self._scope(SglRoleBegin(role), SglRoleEnd(role))

    @contextmanager
    def _scope(self, begin: SglExpr, end: SglExpr) -> Iterator[None]:
        self._record(begin)
        yield
        self._record(end)

    def var_scope(self, name: str):
        return self._scope(SglVarScopeBegin(name), SglVarScopeEnd(name))

    def fork(self, size: int = 1, position_ids_offset: Optional[list[int]] = None) -> "TracerStateGroup":
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"fork size must be a positive int, got {size!r}")
        fork = SglFork(size)
        self._record(fork)
        fork_node = self.nodes[-1]
        branches = []
        for i in range(size):
            b = TracerProgramState(self.graph, self.defined, f"branch {i} of fork %{fork_node.node_id}")
            b._record(SglGetForkItem(i, fork_node))
            branches.append(b)
        return TracerStateGroup(branches, self, fork_node)

    @contextmanager
    def copy(self, position_ids_offset: Optional[list[int]] = None) -> Iterator["TracerProgramState"]:
        group = self.fork(1)
        yield group[0]
        group.join()

    def __getitem__(self, name: str) -> TracedVariable:
        if name not in self.defined:
            raise TracingError(f"variable {name!r} is read before any gen/select/var_scope sets it\n"
                               f"  at {_user_location()}")
        return TracedVariable(name, self.graph.streams[self.defined[name]])

    get_var = __getitem__

    def defining_node(self, name: str, before: SglExpr) -> Optional[SglExpr]:
        return _defining_node(self, name, before)

    def sync(self) -> None:
        pass

    def _unknown(self, what: str) -> TracingError:
        return TracingError(f"cannot trace {what}: the state's content is unknown while tracing\n"
                            f"  at {_user_location()}")

    def text(self) -> str:
        raise self._unknown("s.text()")

    def messages(self) -> list:
        raise self._unknown("s.messages()")

    def get_meta_info(self, name: str) -> Any:
        raise self._unknown("s.get_meta_info()")

    def __setitem__(self, name: str, value: Any) -> None:
        raise self._unknown("setting a variable with s[...] = ...")

    def __contains__(self, name: str) -> bool:
        raise self._unknown("`name in s`")


class TracerStateGroup(BranchGroup):
    def __init__(self, branches: list[TracerProgramState], parent: TracerProgramState, fork: SglFork) -> None:
        self.states = branches
        self.parent = parent
        self.fork_node = fork

    def join(self, mode: str = "gather_variable") -> None:
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}")
        names: list[str] = []
        if mode == "gather_variable":
            # As in the interpreter: only variables the parent did not know before come back, as lists.
            for st in self.states:
                names += [n for n in st.own_vars if n not in self.parent.defined and n not in names]
        self.parent._record(SglJoin(self.fork_node, list(self.states), mode, names))
        for n in names:
            self.parent._define(n)


@dataclass
class Edge:
    src: SglExpr
    dst: SglExpr
    kind: str  # "stream" (intra-stream order), "fork", "join", "variable"


@dataclass
class TracedProgram:
    """The IR graph of one program: its streams (0 is the main one) and every node in trace order."""

    name: str
    arg_names: list[str]
    program: Optional[Traceable] = None
    streams: list[TracerProgramState] = field(default_factory=list)
    nodes: list[SglExpr] = field(default_factory=list)

    @property
    def main(self) -> TracerProgramState:
        return self.streams[0]

    @property
    def last_node(self) -> Optional[SglExpr]:
        """The main stream's last node (`.print_graph_dfs()` prints the graph up to it, as in SGLang)."""
        return self.main.nodes[-1] if self.main.nodes else None

    def edges(self) -> list[Edge]:
        out: list[Edge] = []
        for n in self.nodes:
            if n.prev_node is not None:
                out.append(Edge(n.prev_node, n, "stream"))
            if isinstance(n, SglGetForkItem):
                out.append(Edge(n.fork, n, "fork"))
            elif isinstance(n, SglJoin):
                out += [Edge(b.nodes[-1], n, "join") for b in n.branches]
            elif isinstance(n, SglVariable) and n.source.pid != n.pid:
                src = _defining_node(n.source, n.name, before=n)
                if src is not None:
                    out.append(Edge(src, n, "variable"))
        return out

    def topological_order(self) -> list[SglExpr]:
        """Kahn's algorithm over edges(); ties go to the earlier traced node, so trace order is kept where the
        graph allows it."""
        indeg = {id(n): 0 for n in self.nodes}
        succ: dict[int, list[SglExpr]] = {id(n): [] for n in self.nodes}
        for e in self.edges():
            indeg[id(e.dst)] += 1
            succ[id(e.src)].append(e.dst)
        heap = [(n.node_id, i, n) for i, n in enumerate(self.nodes) if indeg[id(n)] == 0]
        heapq.heapify(heap)
        order: list[SglExpr] = []
        while heap:
            _, _, n = heapq.heappop(heap)
            order.append(n)
            for m in succ[id(n)]:
                indeg[id(m)] -= 1
                if indeg[id(m)] == 0:
                    heapq.heappush(heap, (m.node_id, id(m), m))
        if len(order) != len(self.nodes):
            raise TracingError("the traced graph has a cycle")
        return order

    def pretty(self) -> str:
        lines = [f"program {self.name}({', '.join(self.arg_names)})"]
        for st in self.streams:
            lines.append(f"stream {st.pid} ({'main' if st.pid == 0 else st.label}):")
            lines += [f"  %{n.node_id} = {describe_node(n)}" for n in st.nodes]
        return "\n".join(lines)

    def print(self) -> None:
        print(self.pretty())

    __str__ = pretty


def _defining_node(stream: TracerProgramState, name: str, before: SglExpr) -> Optional[SglExpr]:
    """The last node of `stream` traced before `before` that sets `name`."""
    found = None
    for n in stream.nodes:
        if n.node_id > before.node_id:
            break
        if isinstance(n, (SglGen, SglSelect, SglVarScopeEnd)) and n.name == name:
            found = n
        elif isinstance(n, SglJoin) and name in n.var_names:
            found = n
        elif isinstance(n, SglSeparateReasoning) and name in n.names + [n.reasoning_name(x) for x in n.names]:
            found = n
    return found


def _trace(program: Traceable, arguments: dict[str, Any]) -> tuple[TracedProgram, Optional[BaseException]]:
    kwargs = {**program.bind_arguments, **arguments}
    unknown = sorted(set(kwargs) - set(program.arg_names))
    if unknown:
        raise TypeError(f"{program.func.__name__}() has no parameter(s) {unknown}")
    graph = TracedProgram(program.func.__name__, list(program.arg_names), program)
    state = TracerProgramState(graph, {}, "main")
    call_kwargs = {name: kwargs[name] if name in kwargs else TracedArgument(name) for name in program.arg_names}
    token = _TRACING.set(graph)
    try:
        state.ret_value = program.func(state, **call_kwargs)
    except Exception as e:  # the partial graph is still useful (the constant prefix)
        return graph, e
    finally:
        _TRACING.reset(token)
    return graph, None


def tracing() -> bool:
    """Whether a program is being traced on this thread (an sgl.function called now is traced into its graph)."""
    return _TRACING.get() is not None


def trace_call(program: Traceable, args: tuple, kwargs: dict[str, Any]) -> TracerProgramState:
    """An sgl.function called by a traced program, as SGLang traces it: a stream of its own in the caller's graph
    (starting empty, as its run would) whose arguments may be the caller's traced values."""
    graph = _TRACING.get()
    name = program.func.__name__
    try:
        bound = inspect.signature(program.func).bind(None, *args, **{**program.bind_arguments, **kwargs})
    except TypeError as e:
        raise TracingError(f"{name}() called while tracing: {e} (run-level options such as temperature or "
                           f"backend cannot be given to a nested call)\n  at {_user_location()}") from None
    bound.apply_defaults()
    state = TracerProgramState(graph, {}, f"call of {name}")
    state.ret_value = program.func(state, *bound.args[1:], **bound.kwargs)
    return state


def trace_program(program: Traceable, arguments: dict[str, Any],
                  backend: Optional["BaseBackend"] = None) -> TracedProgram:
    """The program's graph; `arguments` binds some parameters to concrete values, the rest stay abstract."""
    graph, err = _trace(program, arguments)
    if err is not None:
        raise err
    return graph


def extract_prefix_by_tracing(program: Traceable, backend: "BaseBackend") -> str:
    """The text every run of the program starts with: the main stream's leading constant text and role markers
    (rendered with the backend's chat template), up to the first argument, gen or anything else."""
    graph, _ = _trace(program, {})
    exe = StreamExecutor(backend, {}, SglSamplingParams(), None, stream=False, use_thread=False)
    try:
        for n in graph.main.nodes:
            if not isinstance(n, (SglConstantText, SglRoleBegin, SglRoleEnd)):
                break
            exe._execute(n)
        return exe.text_
    finally:
        exe.end()
