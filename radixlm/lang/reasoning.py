"""`sgl.separate_reasoning`: split a reasoning model's output into its thinking and its answer.

After the gen (or select) named X has run, X keeps the answer and `X_reasoning_content` the thinking; the state's
text keeps the answer only. The split is radixlm.runtime.parsers.reasoning's, by SGLang's reasoning parser names."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from radixlm.runtime.parsers.reasoning import REASONING_PARSERS, ReasoningParser

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor
    from radixlm.lang.ir import SglSeparateReasoning


def reasoning_parser(model_type: Optional[str]) -> ReasoningParser:
    """The parser of `model_type` (a `--reasoning-parser` name); no chat template is known here, so a hybrid model's
    output is reasoning only from an opening tag."""
    if not model_type:
        raise ValueError("separate_reasoning needs a model_type (e.g. 'deepseek-r1', 'qwen3')")
    try:
        return ReasoningParser(model_type)
    except ValueError:
        known = sorted(REASONING_PARSERS)
        raise ValueError(f"unsupported reasoning model type {model_type!r}; known: {known}") from None


def split_reasoning(model_type: str, text: str) -> tuple[str, str]:
    """(reasoning, answer). Without an end tag the output was cut inside the thinking: all of it is reasoning."""
    split = reasoning_parser(model_type).split(text)
    return split.reasoning, split.content


def execute_separate_reasoning(exe: "StreamExecutor", expr: "SglSeparateReasoning") -> None:
    """Runs right after the gens of `expr.names`, so the state's text ends with their outputs."""
    if exe.stream:
        return  # as SGLang: nothing is separated while streaming
    parser = reasoning_parser(expr.model_type)
    for name in reversed(expr.names):  # from the end of the text back
        value = exe.variables[name]
        if not isinstance(value, str):
            raise ValueError(f"separate_reasoning needs a single output; {name!r} holds {type(value).__name__}")
        split = parser.split(value)
        reasoning, answer = split.reasoning, split.content
        exe.replace_last_text(value, answer)
        exe.finish_deferred_var(name, answer)
        exe._set_var_done(expr.reasoning_name(name), reasoning)
