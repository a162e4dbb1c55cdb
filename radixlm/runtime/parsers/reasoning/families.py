"""The reasoning formats by SGLang's `--reasoning-parser` names: the tags of each family and whether its output
starts inside the reasoning block, which for hybrid models a chat-template kwarg decides."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from radixlm.runtime.parsers.reasoning.think import ThinkTags


class StartMode(enum.Enum):
    """Whether the output starts inside the reasoning block (an opening tag the model writes anyway is dropped)."""

    ALWAYS = "always"  # the chat template opens the block (DeepSeek-R1, Qwen3-Thinking)
    ON_TAG = "on_tag"  # only an opening tag at the start of the output opens it
    UNLESS_DISABLED = "unless_disabled"  # ALWAYS unless the template kwarg `toggle` is false (Qwen3: enable_thinking)
    IF_ENABLED = "if_enabled"  # ALWAYS only when the template kwarg `toggle` is true (DeepSeek-V3.1: thinking)


@dataclass(frozen=True)
class ReasoningFamily:
    tags: ThinkTags | None  # None: OpenAI's harmony channels (gpt-oss)
    start: StartMode
    toggle: str | None = None  # the chat_template_kwargs key that switches thinking on and off

    def __post_init__(self) -> None:
        toggled = self.start in (StartMode.UNLESS_DISABLED, StartMode.IF_ENABLED)
        if toggled != (self.toggle is not None):
            raise ValueError(f"ReasoningFamily: start mode {self.start.value} {'needs' if toggled else 'takes no'} "
                             f"toggle")

    @property
    def keeps_special_tokens(self) -> bool:
        """Its markers are special tokens, which the detokenizer must keep in the text."""
        return self.tags is None

    def starts_in_reasoning(self, template_kwargs: Mapping[str, Any] | None) -> bool:
        """For a chat request whose template got `template_kwargs` (None: no template, e.g. a raw completion, where
        only an opening tag tells)."""
        if self.start is StartMode.ALWAYS:
            return True
        if self.start is StartMode.ON_TAG or template_kwargs is None or self.toggle is None:
            return False
        value = template_kwargs.get(self.toggle)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"chat_template_kwargs.{self.toggle}: must be a boolean, got {value!r}")
        if self.start is StartMode.UNLESS_DISABLED:
            return value is not False
        return value is True


_THINK = ThinkTags("<think>", "</think>")
_THINK_TOOLS = ThinkTags("<think>", "</think>", tool_start="<tool_call>")

FAMILIES: dict[str, ReasoningFamily] = {
    "deepseek-r1": ReasoningFamily(_THINK, StartMode.ALWAYS),
    "deepseek-v3": ReasoningFamily(_THINK, StartMode.IF_ENABLED, "thinking"),
    "qwen3": ReasoningFamily(_THINK_TOOLS, StartMode.UNLESS_DISABLED, "enable_thinking"),
    "qwen3-thinking": ReasoningFamily(_THINK_TOOLS, StartMode.ALWAYS),
    "glm45": ReasoningFamily(_THINK_TOOLS, StartMode.UNLESS_DISABLED, "enable_thinking"),
    "kimi": ReasoningFamily(ThinkTags("◁think▷", "◁/think▷"), StartMode.ON_TAG),
    "kimi_k2": ReasoningFamily(ThinkTags("<think>", "</think>", tool_start="<|tool_calls_section_begin|>"),
                               StartMode.UNLESS_DISABLED, "thinking"),
    "gpt-oss": ReasoningFamily(None, StartMode.ALWAYS),
    "step3": ReasoningFamily(_THINK, StartMode.ALWAYS),
    "step3p5": ReasoningFamily(_THINK, StartMode.ALWAYS),
    "interns1": ReasoningFamily(_THINK_TOOLS, StartMode.UNLESS_DISABLED, "enable_thinking"),
    "minimax": ReasoningFamily(_THINK_TOOLS, StartMode.ALWAYS),
    "nemotron_3": ReasoningFamily(_THINK_TOOLS, StartMode.UNLESS_DISABLED, "enable_thinking"),
    "mimo": ReasoningFamily(_THINK_TOOLS, StartMode.IF_ENABLED, "enable_thinking"),
}
REASONING_PARSERS: tuple[str, ...] = tuple(FAMILIES)


def family(name: str) -> ReasoningFamily:
    """The family of a parser name (case-insensitive); ValueError naming the known ones."""
    try:
        return FAMILIES[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown reasoning parser {name!r}; choose from {REASONING_PARSERS}") from None
