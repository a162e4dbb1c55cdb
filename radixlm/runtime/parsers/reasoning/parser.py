"""ReasoningParser: one model output's reasoning split, whole (`split`) or streamed (`stream`, then `finish`)."""
from __future__ import annotations

from typing import Any, Mapping

from radixlm.runtime.parsers.reasoning.base import Detector, Split
from radixlm.runtime.parsers.reasoning.families import ReasoningFamily, family
from radixlm.runtime.parsers.reasoning.harmony import HarmonyDetector
from radixlm.runtime.parsers.reasoning.think import ThinkDetector


class ReasoningParser:
    """The split of one output: `stream` each new piece of text, then `finish` once; the results add up to `split`
    of the whole text, however the text was cut into pieces. Malformed or cut-off text never raises."""

    def __init__(self, name: str, starts_in_reasoning: bool | None = None):
        """`starts_in_reasoning` None: the family's own rule without a chat template (only ALWAYS families start
        inside the block)."""
        self.name = name.lower() if isinstance(name, str) else name
        self.family: ReasoningFamily = family(name)
        self.starts_in_reasoning = (self.family.starts_in_reasoning(None) if starts_in_reasoning is None
                                    else starts_in_reasoning)
        self._detector = self._new_detector()

    @classmethod
    def for_request(cls, name: str, template_kwargs: Mapping[str, Any] | None) -> ReasoningParser:
        """For a chat request whose template was given `template_kwargs` (its `enable_thinking` / `thinking`
        decides whether a hybrid model's output starts in the reasoning). ValueError: unknown name, or a toggle
        that is not a boolean."""
        fam = family(name)
        return cls(name, fam.starts_in_reasoning(template_kwargs or {}))

    @property
    def keeps_special_tokens(self) -> bool:
        return self.family.keeps_special_tokens

    def _new_detector(self) -> Detector:
        if self.family.tags is None:
            return HarmonyDetector()
        return ThinkDetector(self.family.tags, self.starts_in_reasoning)

    def split(self, text: str) -> Split:
        """The whole output's split (independent of any streaming in progress)."""
        detector = self._new_detector()
        return detector.feed(text) + detector.finish()

    def stream(self, delta: str) -> Split:
        """What the next piece of output adds to the reasoning and the content (a possible partial tag is held)."""
        return self._detector.feed(delta)

    def finish(self) -> Split:
        """What was held back, at the end of the output."""
        return self._detector.finish()
