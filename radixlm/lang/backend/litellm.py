"""LiteLLM: any provider the `litellm` package reaches (`litellm.completion`), as SGLang's `sgl.LiteLLM`.

The state's messages are sent (text outside any role becomes one user message); the chat template follows the
model name. Constraints and select need token-level access that LiteLLM's chat API does not give."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

from radixlm.lang.backend.base_backend import BackendError, BaseBackend, GenResult
from radixlm.lang.chat_template import ChatTemplate, get_chat_template_by_model_path
from radixlm.lang.ir import SglSamplingParams

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor


def _litellm() -> Any:
    try:
        import litellm
    except ImportError as e:
        raise ImportError("sgl.LiteLLM needs the litellm package (pip install litellm)") from e
    return litellm


class LiteLLM(BaseBackend):
    def __init__(self, model_name: str, chat_template: Optional[ChatTemplate] = None, api_key: Optional[str] = None,
                 organization: Optional[str] = None, base_url: Optional[str] = None,
                 timeout: Optional[float] = 600, max_retries: Optional[int] = None,
                 default_headers: Optional[Mapping[str, str]] = None) -> None:
        super().__init__()
        litellm = _litellm()  # fails here, at construction, when the package is missing
        self.model_name = model_name
        self.chat_template = chat_template or get_chat_template_by_model_path(model_name)
        self.client_params = {"api_key": api_key, "organization": organization, "base_url": base_url,
                              "timeout": timeout, "default_headers": default_headers,
                              "max_retries": getattr(litellm, "num_retries", None) if max_retries is None
                              else max_retries}

    def get_model_name(self) -> str:
        return self.model_name

    def _request(self, s: "StreamExecutor", sp: SglSamplingParams) -> dict[str, Any]:
        if sp.regex is not None or sp.json_schema is not None or sp.dtype is not None:
            raise BackendError("regex/json_schema/dtype constraints need RuntimeEndpoint; the LiteLLM backend "
                               "cannot constrain decoding")
        messages = [dict(m) for m in s.messages_] if s.messages_ else [{"role": "user", "content": s.text_}]
        kw = {k: v for k, v in sp.to_openai_kwargs().items() if v is not None}
        if kw.get("n") == 1:
            del kw["n"]
        return {"model": self.model_name, "messages": messages, **self.client_params, **kw}

    def generate(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> GenResult:
        res = _litellm().completion(**self._request(s, sampling_params))
        texts = [c.message.content or "" for c in res.choices]
        return (texts if sampling_params.n != 1 else texts[0]), {}

    def generate_stream(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        for chunk in _litellm().completion(stream=True, **self._request(s, sampling_params)):
            piece = chunk.choices[0].delta.content if chunk.choices else None
            if piece:
                yield piece, {}

    def select(self, s, choices, temperature, choices_method):
        raise BackendError("select needs prompt token logprobs, which LiteLLM's chat API does not return")
