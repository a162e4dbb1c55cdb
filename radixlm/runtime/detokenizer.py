"""Incremental, UTF-8-safe detokenization and stop-string trimming."""
from __future__ import annotations

from collections.abc import Callable

from radixlm.runtime.messages import DetokenizeInfo

BatchDecode = Callable[[list[list[int]], bool], list[str]]  # (id lists, skip_special_tokens) -> their texts
# Spaces before punctuation: a tokenizer whose decode cleans them up differs from its Rust decoder's output here.
_CLEANUP_PROBE = "a , b . c ! d ? e 's f n't g 'm h 've i 're"

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
        prefix, full = self.windows(new_ids)
        return self.take(self._decode(prefix), self._decode(full))

    def windows(self, new_ids: list[int]) -> tuple[list[int], list[int]]:
        """append in two halves, so that many requests' windows are decoded in one call: adds the tokens and
        returns the two id lists to decode; take() then gets their texts."""
        self.ids.extend(new_ids)
        return self.ids[self.surr_offset : self.read_offset], self.ids[self.surr_offset :]

    def take(self, prefix: str, full: str) -> str:
        new_text = full[len(prefix) :]
        if not new_text or new_text.endswith("\ufffd"):
            return ""
        self.text += new_text
        self.surr_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text


class DecodeState:
    """Text side of one request: cumulative text, UTF-8 safe, stop strings held back while streaming
    and trimmed at the end. Lives in the detokenizer (server) or the Engine's scheduler thread."""

    def __init__(self, tokenizer, info: DetokenizeInfo):
        self.tokenizer, self.info = tokenizer, info
        self.output_ids: list[int] = []
        self.decoder = IncrementalDecoder(tokenizer, info.prompt_tail, info.skip_special_tokens)

    def update(self, new_ids: list[int], finished_reason: dict | None) -> str:
        seqs = self.windows(new_ids, finished_reason)
        skip = self.info.skip_special_tokens
        return self.take([self.tokenizer.decode(s, skip_special_tokens=skip) for s in seqs], finished_reason)

    def windows(self, new_ids: list[int], finished_reason: dict | None) -> list[list[int]]:
        """update in two halves (the detokenizer decodes every request's windows in one call): adds the tokens and
        returns the id lists to decode (with info.skip_special_tokens); take() then gets their texts."""
        self.output_ids.extend(new_ids)
        if finished_reason is None:
            return list(self.decoder.windows(new_ids))
        # The final text is decoded whole (the incremental decoder's text is for streaming only).
        ids = self.output_ids
        if finished_reason.get("type") == "stop" and isinstance(finished_reason.get("matched"), int) and not self.info.no_stop_trim:
            ids = ids[:-1]
        return [ids]

    def take(self, texts: list[str], finished_reason: dict | None) -> str:
        if finished_reason is None:
            self.decoder.take(*texts)
            return hold_back_stop_prefix(self.decoder.text, self.info.stop)
        return trim_stop(texts[0], finished_reason, self.info.no_stop_trim)


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


def batch_decoder(tokenizer) -> BatchDecode:
    """Decodes many id lists in one call, each to what tokenizer.decode(ids, skip_special_tokens=...) gives: the
    Rust tokenizer's decode_batch when transformers' decode is that decoder unchanged (a fast tokenizer whose
    decode methods are not overridden and that cleans up no spaces, as the probe shows), else a loop of decode."""

    def loop(seqs: list[list[int]], skip: bool) -> list[str]:
        return [tokenizer.decode(s, skip_special_tokens=skip) for s in seqs]

    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return loop
    cls = type(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (not isinstance(tokenizer, PreTrainedTokenizerFast) or backend is None
            or cls.decode is not PreTrainedTokenizerFast.decode or cls._decode is not PreTrainedTokenizerFast._decode):
        return loop

    def fast(seqs: list[list[int]], skip: bool) -> list[str]:
        return backend.decode_batch(seqs, skip_special_tokens=skip)

    probe = [tokenizer.encode(_CLEANUP_PROBE, add_special_tokens=False), list(getattr(tokenizer, "all_special_ids", []))]
    for skip in (True, False):
        if fast(probe, skip) != loop(probe, skip):
            return loop
    return fast
