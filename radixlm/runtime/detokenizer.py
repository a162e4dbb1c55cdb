"""Incremental, UTF-8-safe detokenization and stop-string trimming."""
from __future__ import annotations

# Prompt tokens decoded before the output so that the first output token gets its spacing right.
SURROUNDING_TOKENS = 5


class IncrementalDecoder:
    """Decodes a growing token list piece by piece; never emits half a character."""

    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_ids[-SURROUNDING_TOKENS:])
        self.surr_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def append(self, new_ids: list[int]) -> str:
        """Adds tokens; returns the text they complete (possibly empty while a character is incomplete)."""
        self.ids.extend(new_ids)
        prefix = self._decode(self.ids[self.surr_offset : self.read_offset])
        full = self._decode(self.ids[self.surr_offset :])
        new_text = full[len(prefix) :]
        if not new_text or new_text.endswith("\ufffd"):
            return ""
        self.text += new_text
        self.surr_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text


def trim_stop(text: str, finish_reason: dict | None, no_stop_trim: bool) -> str:
    """Cuts a matched stop string (and what follows it) from the final text."""
    if no_stop_trim or not finish_reason or finish_reason.get("type") != "stop":
        return text
    matched = finish_reason.get("matched")
    if isinstance(matched, str) and matched:
        pos = text.find(matched)
        if pos >= 0:
            return text[:pos]
    return text


def hold_back_stop_prefix(text: str, stops: list[str]) -> str:
    """While streaming, withholds a tail that could still grow into a stop string, so none leaks out."""
    cut = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                cut = min(cut, len(text) - k)
                break
    return text[:cut]
