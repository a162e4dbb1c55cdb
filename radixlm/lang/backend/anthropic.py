"""Anthropic: the Messages API through the `anthropic` SDK (radixlm's own /v1/messages included).

The state's messages are sent with the system message split out; text outside any role becomes one user
message. There are no logprobs, so `select` is not available."""
from __future__ import annotations

import inspect
import threading
from typing import TYPE_CHECKING, Any, Iterator

from radixlm.lang.backend.base_backend import BackendError, BaseBackend, GenResult
from radixlm.lang.backend.openai import TokenUsage
from radixlm.lang.chat_template import get_chat_template
from radixlm.lang.ir import SglSamplingParams

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor


class Anthropic(BaseBackend):
    def __init__(self, model_name: str, *args: Any, **kwargs: Any) -> None:
        """kwargs go to the SDK client: base_url, api_key, timeout, max_retries ..."""
        super().__init__()
        import anthropic

        self.client = anthropic.Anthropic(*args, **kwargs)
        self._typed_params = set(inspect.signature(self.client.messages.create).parameters)
        self.model_name = model_name
        self.chat_template = get_chat_template("claude")
        self.token_usage = TokenUsage()
        self._usage_lock = threading.Lock()

    def get_model_name(self) -> str:
        return self.model_name

    def _request(self, s: "StreamExecutor", sp: SglSamplingParams) -> dict[str, Any]:
        if sp.regex is not None or sp.json_schema is not None or sp.dtype is not None:
            raise BackendError("regex/json_schema/dtype constraints need RuntimeEndpoint; the Anthropic backend "
                               "cannot constrain decoding")
        if sp.n != 1:
            raise BackendError("the Anthropic backend generates one sample per gen (n=1)")
        messages = [dict(m) for m in s.messages_] if s.messages_ else [{"role": "user", "content": s.text_}]
        kw: dict[str, Any] = {"model": self.model_name}
        for k, v in sp.to_anthropic_kwargs().items():
            # Newer SDKs dropped the sampling fields from their typed signature; the API still takes them.
            if k in self._typed_params:
                kw[k] = v
            else:
                kw.setdefault("extra_body", {})[k] = v
        if messages and messages[0]["role"] == "system":
            kw["system"] = messages.pop(0)["content"]
        if s.cur_role == "assistant":
            # Text already in the open assistant turn is sent as its start (Anthropic's assistant prefill).
            partial = s.text_[s.cur_role_begin_pos:].strip()
            if partial:
                messages.append({"role": "assistant", "content": partial})
        if not messages:
            raise BackendError("the Anthropic backend needs a user message before a gen")
        kw["messages"] = messages
        return kw

    def _count(self, usage: Any) -> None:
        if usage is not None:
            with self._usage_lock:
                # Anthropic's input_tokens leave out the tokens read from (or written to) its prompt cache.
                self.token_usage.prompt_tokens += sum(getattr(usage, k, 0) or 0 for k in (
                    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
                self.token_usage.completion_tokens += getattr(usage, "output_tokens", 0) or 0

    def generate(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> GenResult:
        import anthropic

        try:
            res = self.client.messages.create(**self._request(s, sampling_params))
        except anthropic.AnthropicError as e:
            raise BackendError(f"Anthropic request failed: {e}") from e
        self._count(res.usage)
        text = "".join(b.text for b in res.content if getattr(b, "type", "") == "text")
        return text, {"id": res.id, "finish_reason": res.stop_reason,
                      "prompt_tokens": res.usage.input_tokens, "completion_tokens": res.usage.output_tokens}

    def generate_stream(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        import anthropic

        try:
            with self.client.messages.stream(**self._request(s, sampling_params)) as stream:
                for piece in stream.text_stream:
                    if piece:
                        yield piece, {}
                final = stream.get_final_message()
        except anthropic.AnthropicError as e:
            raise BackendError(f"Anthropic stream failed: {e}") from e
        self._count(final.usage)
        yield "", {"finish_reason": final.stop_reason, "completion_tokens": final.usage.output_tokens}

    def select(self, s, choices, temperature, choices_method):
        raise BackendError("select needs token logprobs, which the Anthropic Messages API does not return")
