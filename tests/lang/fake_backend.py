"""A scripted backend for interpreter tests: no model, no HTTP; it records what it was asked."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Callable, Optional

from radixlm.lang.backend.base_backend import BaseBackend
from radixlm.lang.chat_template import ChatTemplate, get_chat_template
from radixlm.lang.choices import ChoicesDecision


class FakeBackend(BaseBackend):
    """`reply(prompt, sampling_params)` gives a gen's text (default: "<gen{k}>"); `delay` seconds per gen."""

    def __init__(self, reply: Optional[Callable] = None, delay: float = 0.0,
                 chat_template: Optional[ChatTemplate] = None, fail_on: Optional[str] = None) -> None:
        super().__init__()
        self.chat_template = chat_template or get_chat_template("chatml")
        self.reply = reply
        self.delay = delay
        self.fail_on = fail_on  # a gen whose prompt ends with this raises
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []  # (kind, prompt)
        self.params: list = []
        self.active = 0
        self.max_active = 0
        self.counter = 0

    def _enter(self, kind: str, prompt: str) -> int:
        with self.lock:
            self.calls.append((kind, prompt))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.counter += 1
            return self.counter

    def _leave(self) -> None:
        with self.lock:
            self.active -= 1

    def commit_lazy_operations(self, s) -> None:
        self._enter("commit", s.text_)
        self._leave()

    def cache_prefix(self, prefix_str: str) -> None:
        self._enter("cache_prefix", prefix_str)
        self._leave()

    def generate(self, s, sampling_params):
        k = self._enter("gen", s.text_)
        self.params.append(sampling_params)
        try:
            time.sleep(self.delay)
            if self.fail_on is not None and s.text_.endswith(self.fail_on):
                raise RuntimeError("backend exploded")
            text = self.reply(s.text_, sampling_params) if self.reply else f"<gen{k}>"
            meta = {"prompt_tokens": len(s.text_), "completion_tokens": 1}
            if sampling_params.n > 1:
                return [f"{text}#{i}" for i in range(sampling_params.n)], [meta] * sampling_params.n
            return text, meta
        finally:
            self._leave()

    def generate_stream(self, s, sampling_params):
        self._enter("stream", s.text_)
        try:
            text = self.reply(s.text_, sampling_params) if self.reply else "one two three"
            words = text.split(" ")
            for i, w in enumerate(words):
                time.sleep(self.delay)
                piece = w if i == 0 else " " + w
                yield piece, {"completion_tokens": i + 1, "output_token_logprobs": [[-0.5, i, None]]}
        finally:
            self._leave()

    def select(self, s, choices, temperature, choices_method):
        self._enter("select", s.text_)
        self._leave()
        return ChoicesDecision(max(choices, key=len), {"normalized_prompt_logprobs": [0.0] * len(choices)})


def scripted_chat(*replies: str):
    """An OpenAI chat backend (no network) whose calls answer `replies` in turn (the last one repeats); returns
    it and the list of request kwargs it records."""
    from radixlm.lang.backend.openai import OpenAI

    be = OpenAI("fake", is_chat_model=True, base_url="http://127.0.0.1:9/v1", api_key="unused")
    requests: list[dict] = []

    def create(**kw):
        requests.append(kw)
        text = replies[min(len(requests), len(replies)) - 1]
        return SimpleNamespace(id="x", choices=[SimpleNamespace(message=SimpleNamespace(content=text),
                                                                finish_reason="stop", index=0)],
                               usage=SimpleNamespace(prompt_tokens=10, completion_tokens=len(text)))

    be.client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    return be, requests
