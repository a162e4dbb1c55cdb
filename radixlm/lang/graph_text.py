"""How the tracer prints a graph node (TracedProgram.pretty, CompiledFunction.print_graph)."""
from __future__ import annotations

from radixlm.lang.ir import (SglArgument, SglConstantText, SglExpr, SglFork, SglGen, SglGetForkItem, SglJoin,
                             SglRoleBegin, SglRoleEnd, SglSelect, SglVariable, SglVarScopeBegin, SglVarScopeEnd)


def describe_node(n: SglExpr) -> str:
    if isinstance(n, SglConstantText):
        text = n.value if len(n.value) <= 60 else n.value[:57] + "..."
        return f"ConstantText {text!r}"
    if isinstance(n, SglArgument):
        return f"Argument {n.name}"
    if isinstance(n, SglGen):
        sp = n.sampling_params
        opts = {k: getattr(sp, k) for k in ("max_new_tokens", "stop", "temperature", "regex", "dtype")
                if getattr(sp, k) not in (None, (), [])}
        return f"Gen {n.name} {opts}" if opts else f"Gen {n.name}"
    if isinstance(n, SglSelect):
        return f"Select {n.name} {n.choices!r}"
    if isinstance(n, SglVariable):
        return f"Variable {n.name} <- stream {n.source.pid}"
    if isinstance(n, SglFork):
        return f"Fork {n.number}"
    if isinstance(n, SglGetForkItem):
        return f"GetForkItem {n.index} <- %{n.fork.node_id}"
    if isinstance(n, SglJoin):
        return f"Join {n.mode} {n.var_names} <- streams {[b.pid for b in n.branches]}"
    if isinstance(n, (SglRoleBegin, SglRoleEnd)):
        return f"{type(n).__name__[3:]} {n.role}"
    if isinstance(n, (SglVarScopeBegin, SglVarScopeEnd)):
        return f"{type(n).__name__[3:]} {n.name}"
    return type(n).__name__[3:] if type(n).__name__.startswith("Sgl") else type(n).__name__
