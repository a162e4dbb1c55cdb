"""`sgl.separate_reasoning`: split a reasoning model's output into its thinking and its answer.

After the gen (or select) named X has run, X keeps the answer and `X_reasoning_content` the thinking; the state's
text keeps the answer only. The split follows SGLang's reasoning parsers for the think-tag formats below."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor
    from radixlm.lang.ir import SglSeparateReasoning


@dataclass(frozen=True)
class ThinkFormat:
    start: str
    end: str
    forced: bool  # the output starts inside the thinking even without a start tag
    tool_start: Optional[str] = None  # a tool call that begins before the end tag closes the thinking


_THINK = ThinkFormat("<think>", "</think>", forced=False)
_FORCED = ThinkFormat("<think>", "</think>", forced=True)
_QWEN3 = ThinkFormat("<think>", "</think>", forced=False, tool_start="<tool_call>")
_QWEN3_FORCED = ThinkFormat("<think>", "</think>", forced=True, tool_start="<tool_call>")

THINK_FORMATS: dict[str, ThinkFormat] = {
    "deepseek-r1": _FORCED,
    "step3": _FORCED,
    "step3p5": _FORCED,
    "qwen3": _QWEN3,
    "interns1": _QWEN3,
    "qwen3-thinking": _QWEN3_FORCED,
    "minimax": _QWEN3_FORCED,
    "kimi": ThinkFormat("◁think▷", "◁/think▷", forced=False),
    "kimi_k2": ThinkFormat("<think>", "</think>", forced=False, tool_start="<|tool_calls_section_begin|>"),
}


def think_format(model_type: Optional[str]) -> ThinkFormat:
    if not model_type:
        raise ValueError("separate_reasoning needs a model_type (e.g. 'deepseek-r1', 'qwen3')")
    try:
        return THINK_FORMATS[model_type.lower()]
    except KeyError:
        raise ValueError(f"unsupported reasoning model type {model_type!r}; known: {sorted(THINK_FORMATS)}") from None


def split_reasoning(fmt: ThinkFormat, text: str) -> tuple[str, str]:
    """(reasoning, answer). Without an end tag the output was cut inside the thinking: all of it is reasoning."""
    if not (fmt.forced or fmt.start in text):
        return "", text
    while text.startswith(fmt.start):
        text = text[len(fmt.start):]
    if fmt.end in text:
        reasoning, answer = text.split(fmt.end, 1)
        return reasoning, answer
    if fmt.tool_start is not None and fmt.tool_start in text:
        i = text.index(fmt.tool_start)
        return text[:i], text[i:]
    return text, ""


def execute_separate_reasoning(exe: "StreamExecutor", expr: "SglSeparateReasoning") -> None:
    """Runs right after the gens of `expr.names`, so the state's text ends with their outputs."""
    if exe.stream:
        return  # as SGLang: nothing is separated while streaming
    fmt = think_format(expr.model_type)
    for name in reversed(expr.names):  # from the end of the text back
        value = exe.variables[name]
        if not isinstance(value, str):
            raise ValueError(f"separate_reasoning needs a single output; {name!r} holds {type(value).__name__}")
        reasoning, answer = split_reasoning(fmt, value)
        exe.replace_last_text(value, answer)
        exe.finish_deferred_var(name, answer)
        exe._set_var_done(expr.reasoning_name(name), reasoning)
