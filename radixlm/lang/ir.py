"""The frontend's intermediate representation: the expressions a program appends to a state with `+=`.

The interpreter executes these nodes one by one on a stream; the tracer records the same nodes into a
graph. `node_id`, `prev_node` and `pid` exist for that graph: the interpreter does not read them."""
from __future__ import annotations

import dataclasses
import itertools
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from radixlm.lang.choices import ChoicesSamplingMethod
    from radixlm.lang.state import ProgramState

# The regexes a `dtype` becomes on backends that constrain decoding: SGLang's, so that programs written against its
# contract get the same values. A string is quoted word characters, digits and whitespace only.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r'"[\w\d\s]*"'

_DTYPE_NAMES = {int: "int", float: "float", bool: "bool", str: "str",
                "int": "int", "float": "float", "bool": "bool", "str": "str"}


def normalize_dtype(dtype: Any) -> Optional[str]:
    """`int`, `"int"`, ... -> the name; None stays None; anything else is a clear error."""
    if dtype is None:
        return None
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype must be one of int, float, bool, str (or their names), got {dtype!r}") from None


@dataclass
class SglSamplingParams:
    """Sampling parameters of one gen. The run-level defaults are a full instance; a gen's own parameters are
    merged over them by the interpreter (`None` in a gen means "inherit")."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    n: int = 1
    stop: Union[str, list[str], tuple] = ()
    stop_token_ids: Union[list[int], tuple] = ()
    stop_regex: Union[str, list[str], tuple] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 means the whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    ignore_eos: bool = False
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None
    json_schema: Optional[str] = None
    dtype: Optional[str] = None  # one of "int", "float", "bool", "str"
    regex: Optional[str] = None
    priority: Optional[int] = None  # the request's priority on a radixlm/SGLang server (RuntimeEndpoint)

    def clone(self) -> "SglSamplingParams":
        return dataclasses.replace(self, stop=_as_list(self.stop), stop_token_ids=list(self.stop_token_ids),
                                   stop_regex=_as_list(self.stop_regex))

    def merged_with(self, overrides: "SglSamplingParams") -> "SglSamplingParams":
        """A copy of self with every field `overrides` sets (not None) replaced."""
        out = self.clone()
        for f in dataclasses.fields(overrides):
            v = getattr(overrides, f.name)
            if v is not None:
                setattr(out, f.name, v)
        return out.clone()

    def to_srt_kwargs(self) -> dict[str, Any]:
        """The `sampling_params` of radixlm's (and SGLang's) native /generate."""
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens, "min_new_tokens": self.min_new_tokens, "n": self.n,
            "stop": _as_list(self.stop), "stop_token_ids": list(self.stop_token_ids),
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
            "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
            "ignore_eos": self.ignore_eos,
        }
        if _as_list(self.stop_regex):
            out["stop_regex"] = _as_list(self.stop_regex)
        if self.regex is not None:
            out["regex"] = self.regex
        if self.json_schema is not None:
            out["json_schema"] = self.json_schema
        return out

    def to_openai_kwargs(self) -> dict[str, Any]:
        """OpenAI's chat/completions arguments (top_k and min_p have no OpenAI field and are dropped)."""
        if self.regex or self.json_schema:
            warnings.warn("regex/json_schema are not supported by the OpenAI backend and are ignored")
        stop = _as_list(self.stop)
        return {
            "max_tokens": self.max_new_tokens, "stop": stop or None, "temperature": self.temperature,
            "top_p": self.top_p, "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty, "n": self.n,
        }

    def to_anthropic_kwargs(self) -> dict[str, Any]:
        if self.regex or self.json_schema:
            warnings.warn("regex/json_schema are not supported by the Anthropic backend and are ignored")
        out: dict[str, Any] = {"max_tokens": self.max_new_tokens, "temperature": self.temperature,
                               "top_p": self.top_p}
        stop = _as_list(self.stop)
        if stop:
            out["stop_sequences"] = stop
        if self.top_k > 0:
            out["top_k"] = self.top_k
        return out


def _as_list(x: Union[str, list, tuple, None]) -> list:
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    return list(x)


_node_ids = itertools.count()


class SglExpr:
    """Base of every node. `a + b` builds an SglExprList; strings become SglConstantText."""

    def __init__(self) -> None:
        self.node_id = next(_node_ids)
        self.prev_node: Optional[SglExpr] = None  # set by the tracer
        self.pid: Optional[int] = None  # the stream (program state) the tracer put it on

    def __add__(self, other: Any) -> "SglExprList":
        return SglExprList([self, as_expr(other)])

    def __radd__(self, other: Any) -> "SglExprList":
        return SglExprList([as_expr(other), self])

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def print_graph_dfs(self) -> str:
        """The traced graph up to this node, as SGLang prints it for `f.trace().last_node`: every node this one
        depends on (its stream's earlier nodes, the fork a branch starts from, the branches a join waits for, the
        node that sets a variable read from another stream) before it, one `%id = %prev + node` line each."""
        lines: list[str] = []
        done: set[int] = set()
        stack: list[tuple[SglExpr, bool]] = [(self, False)]
        while stack:  # iterative post-order: long programs have long chains
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            if expanded:
                done.add(id(node))
                prev = f"%{node.prev_node.node_id} + " if node.prev_node is not None else ""
                lines.append(f"%{node.node_id} = {prev}{node!r}")
                continue
            stack.append((node, True))
            stack += [(d, False) for d in reversed(_graph_deps(node)) if id(d) not in done]
        return "\n".join(lines) + "\n"


def as_expr(x: Any) -> SglExpr:
    """Coerces what `s += x` accepts: a node, a string, or a list/tuple of those."""
    if isinstance(x, SglExpr):
        return x
    if isinstance(x, str):
        return SglConstantText(x)
    if isinstance(x, (list, tuple)):
        return SglExprList([as_expr(e) for e in x])
    if x is None:
        raise ValueError("cannot append None to a program state")
    raise TypeError(f"cannot append a {type(x).__name__} to a program state (use a str or an sgl primitive)")


class SglExprList(SglExpr):
    def __init__(self, expr_list: list[SglExpr]) -> None:
        super().__init__()
        flat: list[SglExpr] = []
        for e in expr_list:
            flat.extend(e.expr_list if isinstance(e, SglExprList) else [e])
        self.expr_list = flat

    def __repr__(self) -> str:
        return f"SglExprList({self.expr_list!r})"


class SglConstantText(SglExpr):
    def __init__(self, value: str) -> None:
        super().__init__()
        self.value = value

    def __repr__(self) -> str:
        return f"SglConstantText({self.value!r})"


class SglArgument(SglExpr):
    """A program argument; the tracer binds abstract ones, the interpreter never sees them."""

    def __init__(self, name: str, value: Any = None) -> None:
        super().__init__()
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"SglArgument(name={self.name!r})"


class SglGen(SglExpr):
    def __init__(self, name: Optional[str], sampling_params: SglSamplingParams) -> None:
        super().__init__()
        self.name = name
        self.sampling_params = sampling_params

    def __repr__(self) -> str:
        return f"SglGen({self.name!r})"


class SglSelect(SglExpr):
    def __init__(self, name: Optional[str], choices: list[str], temperature: float,
                 choices_method: "ChoicesSamplingMethod") -> None:
        super().__init__()
        self.name = name
        self.choices = choices
        self.temperature = temperature
        self.choices_method = choices_method

    def __repr__(self) -> str:
        return f"SglSelect({self.name!r}, choices={self.choices!r})"


class SglRoleBegin(SglExpr):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def __repr__(self) -> str:
        return f"SglRoleBegin({self.role!r})"


class SglRoleEnd(SglExpr):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def __repr__(self) -> str:
        return f"SglRoleEnd({self.role!r})"


class SglImage(SglExpr):
    def __init__(self, path: Union[str, bytes]) -> None:
        super().__init__()
        self.path = path

    def __repr__(self) -> str:
        return "SglImage(...)"


class SglVideo(SglExpr):
    def __init__(self, path: str, num_frames: int) -> None:
        super().__init__()
        self.path = path
        self.num_frames = num_frames


class SglVariable(SglExpr):
    """The value of variable `name` of another stream (`source`, an executor) appended to this one."""

    def __init__(self, name: str, source: Any) -> None:
        super().__init__()
        self.name = name
        self.source = source

    def __repr__(self) -> str:
        return f"SglVariable({self.name!r})"


class SglVarScopeBegin(SglExpr):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


class SglVarScopeEnd(SglExpr):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


class SglCommitLazy(SglExpr):
    """Send the state's text so far to the backend to prefill and cache it (the fork prefix hint)."""


class SglConcateAndAppend(SglExpr):
    def __init__(self, states: list["ProgramState"]) -> None:
        super().__init__()
        self.states = states


class SglSeparateReasoning(SglExpr):
    """Follows `expr` (gens/selects): splits each one's output into its answer (kept under its name) and its
    reasoning (variable `<name>_reasoning_content`)."""

    def __init__(self, model_type: Optional[str], expr: SglExpr) -> None:
        super().__init__()
        self.model_type = model_type
        self.expr = expr
        self.names = _output_names(expr)
        self.name = self.reasoning_name(self.names[-1]) if self.names else None  # SGLang's attribute

    @staticmethod
    def reasoning_name(name: str) -> str:
        return f"{name}_reasoning_content"

    def __repr__(self) -> str:
        return f"SglSeparateReasoning({self.model_type!r}, {self.names!r})"


def _output_names(expr: SglExpr) -> list[str]:
    items = expr.expr_list if isinstance(expr, SglExprList) else [expr]
    names = []
    for e in items:
        if isinstance(e, (SglGen, SglSelect)):
            if not e.name:
                raise ValueError("separate_reasoning needs a named gen or select (its output is split by name)")
            names.append(e.name)
    return names


class SglFork(SglExpr):
    def __init__(self, number: int) -> None:
        super().__init__()
        self.number = number

    def __repr__(self) -> str:
        return f"SglFork({self.number})"


class SglGetForkItem(SglExpr):
    """The first node of a branch stream: branch `index` of the `fork` node on the parent stream."""

    def __init__(self, index: int, fork: Optional[SglFork] = None) -> None:
        super().__init__()
        self.index = index
        self.fork = fork

    def __repr__(self) -> str:
        return f"SglGetForkItem(%{self.fork.node_id}, {self.index})" if self.fork is not None else \
            f"SglGetForkItem({self.index})"



class SglJoin(SglExpr):
    """Recorded by the tracer on the parent stream: wait for the fork's branches, then either gather the
    variables they created (`var_names`) as lists or append their texts (mode "concate_and_append")."""

    def __init__(self, fork: SglFork, branches: list[Any], mode: str, var_names: list[str]) -> None:
        super().__init__()
        self.fork = fork
        self.branches = branches  # the branch streams (tracer states)
        self.mode = mode
        self.var_names = var_names

    def __repr__(self) -> str:
        return f"SglJoin(mode={self.mode!r}, vars={self.var_names!r})"


def _graph_deps(node: SglExpr) -> list[SglExpr]:
    deps = [node.prev_node] if node.prev_node is not None else []
    if isinstance(node, SglGetForkItem) and node.fork is not None:
        deps.append(node.fork)
    elif isinstance(node, SglJoin):
        deps += [b.nodes[-1] for b in node.branches if getattr(b, "nodes", None)]
    elif isinstance(node, SglVariable) and getattr(node.source, "pid", node.pid) != node.pid:
        find = getattr(node.source, "defining_node", None)  # a traced stream finds the node that sets the name
        setter = find(node.name, node) if find is not None else None
        deps += [setter] if setter is not None else []
    return deps
