"""OpenAI: any OpenAI-compatible endpoint through the `openai` SDK (radixlm's own /v1 included).

Chat models get the state's messages, so a gen must directly follow `assistant` begin; completion models get the
state's text. `select` scores each choice on completion models from echoed prompt logprobs (one batched request);
chat endpoints return no prompt logprobs, so chat models cannot select."""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional

from radixlm.lang.backend.base_backend import BackendError, BaseBackend, GenResult
from radixlm.lang.backend.openai_tokens import int_logit_bias, select_by_logit_bias, tiktoken_encoding
from radixlm.lang.backend.runtime_endpoint import choice_token_logprobs
from radixlm.lang.chat_template import ChatTemplate, get_chat_template_by_model_path
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, normalized_logprob
from radixlm.lang.ir import SglSamplingParams

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor

# Completion-only OpenAI models; any other name is taken for a chat model unless is_chat_model says otherwise.
COMPLETION_MODELS = ("gpt-3.5-turbo-instruct", "davinci-002", "babbage-002")


@dataclass
class TokenUsage:
    """Tokens billed and requests made so far by this backend (summed over every call; reset() starts again)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    num_calls: int = 0

    def reset(self) -> None:
        self.prompt_tokens = self.completion_tokens = self.num_calls = 0


class OpenAI(BaseBackend):
    supports_api_speculation = True

    def __init__(self, model_name: str, is_chat_model: Optional[bool] = None,
                 chat_template: Optional[ChatTemplate] = None, is_azure: bool = False, *args: Any,
                 **kwargs: Any) -> None:
        """kwargs go to the SDK client: base_url, api_key, timeout, max_retries ..."""
        super().__init__()
        import openai

        self.client = openai.AzureOpenAI(*args, **kwargs) if is_azure else openai.OpenAI(*args, **kwargs)
        self.model_name = model_name
        self.is_chat_model = model_name not in COMPLETION_MODELS if is_chat_model is None else is_chat_model
        # As SGLang: the template follows the model name ("default" where none matches). Chat models receive
        # structured messages, so for them it only shapes the state's text; completion models get that text.
        self.chat_template = chat_template or get_chat_template_by_model_path(model_name)
        self.token_usage = TokenUsage()
        self._usage_lock = threading.Lock()
        self._logit_bias_int: Optional[dict[int, int]] = None

    def get_model_name(self) -> str:
        return self.model_name

    def _count(self, usage: Any) -> None:
        if usage is not None:
            with self._usage_lock:
                self.token_usage.prompt_tokens += usage.prompt_tokens or 0
                self.token_usage.completion_tokens += usage.completion_tokens or 0

    def _check_constraints(self, sp: SglSamplingParams) -> None:
        if sp.regex is not None or sp.json_schema is not None or sp.dtype is not None:
            raise BackendError("regex/json_schema/dtype constraints need RuntimeEndpoint; the OpenAI backend "
                               "cannot constrain decoding (except dtype=str and dtype=int on completion models)")

    def _chat_messages(self, s: "StreamExecutor") -> list[dict]:
        prefix = self.chat_template.get_prefix_and_suffix("assistant", s.messages_)[0]
        if s.cur_role != "assistant" or not s.text_.endswith(prefix):
            raise BackendError("for OpenAI chat models, sgl.gen must come right after sgl.assistant begins "
                               "(or use a completion model)")
        return list(s.messages_)

    def _request_kwargs(self, s: "StreamExecutor", sp: SglSamplingParams) -> dict[str, Any]:
        self._check_constraints(sp)
        kw = sp.to_openai_kwargs()
        kw = {k: v for k, v in kw.items() if v is not None}
        if is_reasoning_model(self.model_name):  # as SGLang: o1/o3 models take max_completion_tokens only
            kw["max_completion_tokens"] = kw.pop("max_tokens")
        if self.is_chat_model:
            kw["messages"] = self._chat_messages(s)
        else:
            kw["prompt"] = s.text_
        return {"model": self.model_name, **kw}

    def _create(self, **kw: Any) -> Any:
        import openai

        with self._usage_lock:
            self.token_usage.num_calls += 1
        try:
            if "messages" in kw:
                return self.client.chat.completions.create(**kw)
            return self.client.completions.create(**kw)
        except openai.OpenAIError as e:
            raise BackendError(f"OpenAI request failed: {e}") from e

    def generate(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> GenResult:
        # dtype=str on a completion model (as SGLang): the prompt opens a quote, the reply ends at the closing one.
        quoted = sampling_params.dtype == "str" and not self.is_chat_model
        # dtype=int on a completion model (as SGLang): only digit tokens, a space (which ends it) or end of text.
        as_int = sampling_params.dtype == "int" and not self.is_chat_model
        if quoted:
            kw = self._request_kwargs(s, _json_string_params(sampling_params))
            kw["prompt"] += '"'
        elif as_int:
            kw = self._request_kwargs(s, dataclasses.replace(sampling_params.clone(), dtype=None, stop=[" "]))
            kw["logit_bias"] = self._int_logit_bias()
        else:
            kw = self._request_kwargs(s, sampling_params)
        res = self._create(**kw)
        self._count(res.usage)
        if self.is_chat_model:
            texts = [c.message.content or "" for c in res.choices]
        else:
            texts = [c.text for c in res.choices]
        if quoted:
            texts = [f'"{t}"' for t in texts]
        metas = [{"id": res.id, "finish_reason": c.finish_reason,
                  "prompt_tokens": getattr(res.usage, "prompt_tokens", None),
                  "completion_tokens": getattr(res.usage, "completion_tokens", None)} for c in res.choices]
        if sampling_params.n > 1:
            return texts, metas
        return texts[0], metas[0]

    def _int_logit_bias(self) -> dict[int, int]:
        if self._logit_bias_int is None:
            self._logit_bias_int = int_logit_bias(tiktoken_encoding(self.model_name, "dtype=int"))
        return self._logit_bias_int

    def generate_stream(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        if sampling_params.n != 1:
            raise BackendError("streaming supports n=1 only")
        kw = self._request_kwargs(s, sampling_params)
        stream = self._create(**kw, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                self._count(chunk.usage)
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            piece = (c.delta.content or "") if self.is_chat_model else (c.text or "")
            meta = {"finish_reason": c.finish_reason} if c.finish_reason else {}
            if piece or meta:
                yield piece, meta

    def select(self, s: "StreamExecutor", choices: list[str], temperature: float,
               choices_method: ChoicesSamplingMethod) -> ChoicesDecision:
        if self.is_chat_model:
            raise BackendError("select needs prompt logprobs, which chat endpoints do not return; use a "
                               "completion model (is_chat_model=False)")
        try:
            echoed = self._echo_logprobs([s.text_ + c for c in choices])
        except BackendError as e:
            import openai

            if not isinstance(e.__cause__, openai.BadRequestError):
                raise
            # An endpoint without echoed prompt logprobs (OpenAI's own instruct models): SGLang's biased steps.
            enc = tiktoken_encoding(self.model_name, "select without echoed logprobs")
            return select_by_logit_bias(enc, s.text_, choices,
                                        lambda ids, bias: self._biased_token(ids, bias, temperature))
        input_lps = [choice_token_logprobs(s.text_, c, lp) for c, lp in zip(choices, echoed)]
        normalized = [normalized_logprob(lp) for lp in input_lps]
        unconditional = None
        if choices_method.requires_unconditional_logprobs:
            # Text in, text out: the choice alone may tokenize into a different count; align from the end (a
            # missing leading token counts as "no logprob", like the unconditional first token).
            unconditional = [[[None, -1, None]] * max(0, len(c) - len(u)) + u[max(0, len(u) - len(c)):]
                             for u, c in zip(self._echo_logprobs(choices), input_lps)]
        decision = choices_method(choices=choices, normalized_prompt_logprobs=normalized,
                                  input_token_logprobs=input_lps, output_token_logprobs=[[] for _ in choices],
                                  unconditional_token_logprobs=unconditional)
        decision.meta_info.update(normalized_prompt_logprobs=normalized, input_token_logprobs=input_lps)
        return decision

    def _biased_token(self, prompt_ids: list[int], logit_bias: dict[int, int], temperature: float) -> str:
        res = self._create(model=self.model_name, prompt=prompt_ids, logit_bias=logit_bias, max_tokens=1,
                           temperature=temperature)
        self._count(res.usage)
        return res.choices[0].text

    def _echo_logprobs(self, prompts: list[str]) -> list[list[list]]:
        """Per prompt, its tokens as [logprob, index, text] (the first logprob is None), via echo."""
        res = self._create(model=self.model_name, prompt=prompts, max_tokens=0, echo=True, logprobs=0,
                           temperature=0)
        self._count(res.usage)
        out: list[list[list]] = [[] for _ in prompts]
        for c in res.choices:
            lp = c.logprobs
            if lp is None:
                raise BackendError("the endpoint returned no logprobs for an echo request")
            out[c.index] = [[v, i, t] for i, (v, t) in enumerate(zip(lp.token_logprobs, lp.tokens))]
        return out


def is_reasoning_model(model_name: str) -> bool:
    """OpenAI's reasoning models (o1, o3, o4-mini ...), which refuse max_tokens for max_completion_tokens."""
    return model_name.startswith(("o1", "o3", "o4")) or "o1" in model_name


def _json_string_params(sp: SglSamplingParams) -> SglSamplingParams:
    """The request for the inside of a JSON string: it stops at the closing quote, or at a newline, which a JSON
    string cannot hold raw."""
    out = sp.clone()
    out.dtype = None
    out.stop = ['"', "\n"]
    return out
