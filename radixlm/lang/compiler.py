"""Compiled programs (paper Appendix D): a traced graph run by a graph executor, without re-running Python.

One GraphStreamExecutor per traced stream; the dispatcher walks the graph in topological order and submits each
node to its stream's queue without blocking, so independent streams run concurrently. Cross-stream waits happen
inside the workers: a branch's first node waits for its parent to reach the fork, a join waits for a barrier
node at the end of each branch, and a variable reference waits for the defining stream's event."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from radixlm.lang.global_config import GlobalConfig, global_config, resolve_backend
from radixlm.lang.interpreter import ProgramError, StreamExecutor
from radixlm.lang.ir import (SglArgument, SglExpr, SglFork, SglGetForkItem, SglJoin, SglSamplingParams,
                             SglVariable, as_expr)
from radixlm.lang.state import ProgramState
from radixlm.lang.tracer import TracedProgram

if TYPE_CHECKING:
    from radixlm.lang.backend.base_backend import BaseBackend

_SAMPLING_FIELDS = set(SglSamplingParams.__dataclass_fields__) | {"max_tokens"}


@dataclass
class _ForkPoint:
    """Filled by the parent's worker when it reaches the fork: the state every branch starts from."""

    number: int
    ready: threading.Event = field(default_factory=threading.Event)
    snapshot: dict = field(default_factory=dict)
    error: Optional[BaseException] = None


class _RunFork(SglExpr):
    def __init__(self, point: _ForkPoint) -> None:
        super().__init__()
        self.point = point


class _RunForkItem(SglExpr):
    def __init__(self, point: _ForkPoint, parent: "GraphStreamExecutor") -> None:
        super().__init__()
        self.point = point
        self.parent = parent


class _Barrier(SglExpr):
    """Appended to a branch at the join: reached means every node the branch had before the join has run."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = False


class _RunJoin(SglExpr):
    def __init__(self, node: SglJoin, branches: list["GraphStreamExecutor"], barriers: list[_Barrier]) -> None:
        super().__init__()
        self.node = node
        self.branches = branches
        self.barriers = barriers


class GraphStreamExecutor(StreamExecutor):
    """A stream executor that also runs the graph-only nodes (arguments, fork points, joins)."""

    def _init_var_events(self, expr: SglExpr) -> None:
        super()._init_var_events(expr)
        if isinstance(expr, _RunJoin):
            with self.cond:
                for name in expr.node.var_names:
                    self.variable_event[name] = threading.Event()

    def _execute(self, expr: SglExpr) -> None:
        if isinstance(expr, SglArgument):
            value = self.arguments[expr.name]
            self._execute(as_expr(value if isinstance(value, (str, SglExpr, list, tuple)) else str(value)))
        elif isinstance(expr, _RunFork):
            self._execute_fork_point(expr.point)
        elif isinstance(expr, _RunForkItem):
            self._execute_fork_item(expr)
        elif isinstance(expr, _Barrier):
            with self.cond:
                expr.reached = True
                self.cond.notify_all()
        elif isinstance(expr, _RunJoin):
            self._execute_join(expr)
        else:
            super()._execute(expr)

    def _execute_fork_point(self, point: _ForkPoint) -> None:
        try:
            if point.number > 1 and self.config.enable_fork_prefix_hint:
                self.backend.commit_lazy_operations(self)
            point.snapshot = {"variables": dict(self.variables), "meta_info": dict(self.meta_info),
                              "text_": self.text_, "messages_": list(self.messages_),
                              "images_": list(self.images_), "videos_": list(self.videos_), "cur_role": self.cur_role,
                              "cur_role_begin_pos": self.cur_role_begin_pos}
        except Exception as e:
            point.error = e
            raise
        finally:
            point.ready.set()

    def _execute_fork_item(self, expr: _RunForkItem) -> None:
        point = expr.point
        with expr.parent.cond:
            # The parent may fail before it reaches the fork; then the fork point is never filled.
            expr.parent.cond.wait_for(lambda: point.ready.is_set() or expr.parent.is_finished)
        if not point.ready.is_set() or point.error is not None:
            raise ProgramError("the parent stream failed before the fork") from (point.error or expr.parent.error_)
        with self.cond:
            for k, v in point.snapshot.items():
                setattr(self, k, v if not isinstance(v, (dict, list)) else type(v)(v))
            self.fork_start_text_pos = len(self.text_)
            self.cond.notify_all()

    def _execute_join(self, expr: _RunJoin) -> None:
        for b, barrier in zip(expr.branches, expr.barriers):
            with b.cond:
                b.cond.wait_for(lambda: barrier.reached or b.is_finished)
            b.raise_if_error()
        node = expr.node
        if node.mode == "gather_variable":
            for name in node.var_names:
                self._set_var_done(name, [b.variables[name] for b in expr.branches if name in b.variables])
            return
        if self.backend.support_concate_and_append and self.config.enable_parallel_encoding:
            self.backend.concatenate_and_append([b.sid for b in expr.branches], self.sid)
        self._append_text("".join(b.text_[b.fork_start_text_pos:] for b in expr.branches))


def split_run_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], SglSamplingParams]:
    """(program arguments, run-level sampling defaults) from one keyword dict."""
    args = {k: v for k, v in kwargs.items() if k not in _SAMPLING_FIELDS}
    sp = {k: v for k, v in kwargs.items() if k in _SAMPLING_FIELDS}
    if "max_tokens" in sp:
        sp["max_new_tokens"] = sp.pop("max_tokens")
    return args, SglSamplingParams(**{k: v for k, v in sp.items() if v is not None})


class CompiledFunction:
    """What `SglFunction.compile()` returns: `run(**arguments, temperature=..., backend=...)` and `run_batch`."""

    def __init__(self, graph: TracedProgram, backend: Optional["BaseBackend"] = None,
                 config: GlobalConfig = global_config) -> None:
        self.graph = graph
        self.order = graph.topological_order()
        self.backend = backend
        self.config = config
        self.num_api_spec_tokens = graph.program.num_api_spec_tokens if graph.program is not None else None

    def __str__(self) -> str:
        return self.graph.pretty()

    def print_graph(self) -> None:
        self.graph.print()

    def run(self, *, backend: Optional["BaseBackend"] = None, **kwargs: Any) -> ProgramState:
        arguments, sp = split_run_kwargs(kwargs)
        bound = {**(self.graph.program.bind_arguments if self.graph.program else {}), **arguments}
        missing = [n for n in self.graph.arg_names if n not in bound and self._uses_argument(n)]
        if missing:
            raise TypeError(f"{self.graph.name}() is missing argument(s) {missing}")
        return self._execute(resolve_backend(backend if backend is not None else self.backend), bound, sp)

    def run_batch(self, batch_kwargs: list[dict], *, backend: Optional["BaseBackend"] = None,
                  num_threads: Union[str, int] = "auto", **kwargs: Any) -> list[ProgramState]:
        n = len(batch_kwargs)
        workers = min(64, n) if num_threads == "auto" else int(num_threads)

        def one(item: dict) -> ProgramState:
            st = self.run(backend=backend, **kwargs, **item)
            st.sync()
            return st

        with ThreadPoolExecutor(max(1, workers)) as pool:
            return list(pool.map(one, batch_kwargs))

    def _uses_argument(self, name: str) -> bool:
        return any(isinstance(n, SglArgument) and n.name == name for n in self.graph.nodes)

    def _execute(self, backend: "BaseBackend", arguments: dict[str, Any], sp: SglSamplingParams) -> ProgramState:
        main = GraphStreamExecutor(backend, arguments, sp, chat_template=None, stream=False,
                                   num_api_spec_tokens=self.num_api_spec_tokens, config=self.config)
        exes: dict[int, GraphStreamExecutor] = {0: main}
        points: dict[int, _ForkPoint] = {}  # fork node id -> its point
        try:
            for node in self.order:
                exe = exes.get(node.pid)
                if exe is None and not isinstance(node, SglGetForkItem):
                    # The stream of an sgl.function the program called: it starts empty, as its run would.
                    exe = exes[node.pid] = GraphStreamExecutor(backend, arguments, sp, chat_template=None,
                                                               stream=False, config=self.config)
                if isinstance(node, SglFork):
                    points[node.node_id] = _ForkPoint(node.number)
                    exe.submit(_RunFork(points[node.node_id]))
                elif isinstance(node, SglGetForkItem):
                    parent = exes[node.fork.pid]
                    child = GraphStreamExecutor(backend, arguments, sp, parent.chat_template, stream=False,
                                                config=self.config)
                    exes[node.pid] = child
                    child.submit(_RunForkItem(points[node.fork.node_id], parent))
                elif isinstance(node, SglJoin):
                    branches = [exes[b.pid] for b in node.branches]
                    barriers = [_Barrier() for _ in branches]
                    for b, barrier in zip(branches, barriers):
                        b.submit(barrier)
                    exe.submit(_RunJoin(node, branches, barriers))
                elif isinstance(node, SglVariable):
                    exe.submit(SglVariable(node.name, exes[node.source.pid]))
                else:
                    exe.submit(node)
        finally:
            for e in exes.values():
                e.end()
        return ProgramState(main)
