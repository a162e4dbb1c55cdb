"""A request's thinking budget (sampling_params.thinking_budget) resolved against the server's reasoning family: its
tags tokenized (once per server), the prompt read (sampling/thinking_budget.py enforces it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from radixlm.runtime.parsers.reasoning.families import ReasoningFamily, StartMode
from radixlm.runtime.sampling.thinking_budget import ThinkingBudget


@dataclass(frozen=True)
class BudgetTags:
    """A family's tags as token ids."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    tool: tuple[int, ...]  # () when the family has no tool-call tag

    @classmethod
    def tokenize(cls, fam: ReasoningFamily | None, tokenizer) -> "BudgetTags":
        if fam is None or fam.tags is None:
            raise ValueError("thinking_budget needs a reasoning parser whose reasoning block ends with a tag "
                             f"(--reasoning-parser; got {'none' if fam is None else 'a harmony-channel family'})")
        t = fam.tags
        return cls(*(tuple(tokenizer.encode(s, add_special_tokens=False)) if s else ()
                     for s in (t.start, t.end, t.tool_start)))


def resolve(fam: ReasoningFamily, tags: BudgetTags, budget: int, has_grammar: bool, prompt_ids: Sequence[int],
            starts_in_reasoning: bool | None) -> ThinkingBudget:
    """starts_in_reasoning: the chat layer's reasoning parser's (its template kwargs read); None (no template): the
    family's own rule. A block the prompt leaves open counts either way."""
    if has_grammar:
        raise ValueError("thinking_budget cannot be combined with regex, json_schema or ebnf (the grammar constrains "
                         "the output from its first token)")
    always = fam.start is StartMode.ALWAYS if starts_in_reasoning is None else starts_in_reasoning
    return ThinkingBudget.for_prompt(budget, tags.start, tags.end, prompt_ids, always, tags.tool)
