"""Reasoning parsers: a model's output split into its reasoning and its answer, by SGLang's `--reasoning-parser`
names. Pure text processing, shared by the chat, Responses and Anthropic APIs and the frontend language."""
from radixlm.runtime.parsers.reasoning.base import Split
from radixlm.runtime.parsers.reasoning.families import (
    FAMILIES, REASONING_PARSERS, ReasoningFamily, StartMode, family,
)
from radixlm.runtime.parsers.reasoning.parser import ReasoningParser
from radixlm.runtime.parsers.reasoning.think import ThinkTags

__all__ = ["FAMILIES", "REASONING_PARSERS", "ReasoningFamily", "ReasoningParser", "Split", "StartMode", "ThinkTags",
           "family"]
