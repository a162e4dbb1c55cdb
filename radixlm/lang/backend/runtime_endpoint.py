"""RuntimeEndpoint: a radixlm (or SGLang) server reached over its native HTTP API."""
from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

import httpx

from radixlm.lang.backend.base_backend import BackendError, BaseBackend, GenResult
from radixlm.lang.chat_template import (ChatTemplate, get_chat_template, get_chat_template_by_model_path,
                                        read_local_jinja, template_from_jinja)
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, normalized_logprob
from radixlm.lang.global_config import GlobalConfig, global_config
from radixlm.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR, SglSamplingParams

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor

logger = logging.getLogger(__name__)

_DTYPE_REGEX = {"int": REGEX_INT, "float": REGEX_FLOAT, "bool": REGEX_BOOL, "str": REGEX_STR}
# Meta fields that stream chunks carry cumulatively; generate_stream turns them into per-chunk deltas.
_LIST_META = ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs")


class RuntimeEndpoint(BaseBackend):
    def __init__(self, base_url: str, api_key: Optional[str] = None, verify: Optional[Any] = None,
                 chat_template_name: Optional[str] = None, timeout: float = 600.0,
                 config: GlobalConfig = global_config, transport: Optional[httpx.BaseTransport] = None) -> None:
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.config = config
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                   verify=True if verify is None else verify,
                                   limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
                                   transport=transport)
        self.model_info = self._get_json("/get_model_info")
        self.chat_template = self._pick_chat_template(chat_template_name)

    def _pick_chat_template(self, name: Optional[str]) -> ChatTemplate:
        tpl = self._named_or_model_template(name)
        # sgl.image (sgl.video) writes the server's own placeholder, on a line of its own as LLaVA prompts have it.
        tokens = {f: f" {self.model_info[f]}\n" for f in ("image_token", "video_token") if self.model_info.get(f)}
        return dataclasses.replace(tpl, **tokens) if tokens else tpl

    def _named_or_model_template(self, name: Optional[str]) -> ChatTemplate:
        if name is not None:
            return get_chat_template(name)
        # The model's own template when the server returns it (or its tokenizer lies on this machine).
        source = self.model_info.get("chat_template") or read_local_jinja(self.model_info.get("tokenizer_path", ""))
        if source:
            tpl = template_from_jinja(source)
            if tpl is not None:
                return tpl
        return get_chat_template_by_model_path(str(self.model_info.get("model_path", "")))

    # ---- HTTP helpers
    def _get_json(self, path: str) -> Any:
        return _decode(self._request("GET", path), path)

    def _request(self, method: str, path: str, body: Optional[dict] = None) -> httpx.Response:
        try:
            res = self.client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise BackendError(f"{method} {self.base_url}{path} failed: {e!r}") from e
        _raise_for_status(res, path)
        return res

    def _generate(self, body: dict) -> Any:
        return _decode(self._request("POST", "/generate", body), "/generate")

    def get_model_name(self) -> str:
        return str(self.model_info.get("model_path", ""))

    def get_server_info(self) -> dict:
        return self._get_json("/get_server_info")

    def flush_cache(self) -> str:
        return self._request("POST", "/flush_cache").text

    # ---- cache hints
    def cache_prefix(self, prefix_str: str) -> None:
        self._generate({"text": prefix_str, "sampling_params": {"max_new_tokens": 0}})

    def commit_lazy_operations(self, s: "StreamExecutor") -> None:
        if not s.text_:
            return
        self._generate(self._add_images(s, {"text": s.text_, "sampling_params": {"max_new_tokens": 0}}))

    def fill_image(self, s: "StreamExecutor") -> None:
        self.commit_lazy_operations(s)

    # ---- generation
    def _gen_body(self, s: "StreamExecutor", sp: SglSamplingParams, stream: bool) -> dict:
        sp = sp.clone()
        if sp.dtype is not None:
            if sp.regex is not None:
                warnings.warn(f"gen has both dtype={sp.dtype!r} and a regex; the dtype's regex is used")
            sp.regex = _DTYPE_REGEX[sp.dtype]
            if sp.dtype in ("int", "float"):
                sp.stop = list(sp.stop) + [x for x in (" ", "\n") if x not in sp.stop]
        params = sp.to_srt_kwargs()
        params["skip_special_tokens"] = self.config.skip_special_tokens_in_output
        params["spaces_between_special_tokens"] = self.config.spaces_between_special_tokens_in_out
        body: dict[str, Any] = {"text": s.text_, "sampling_params": params}
        for key in ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "priority"):
            v = getattr(sp, key)
            if v is not None:
                body[key] = v
        if stream:
            body["stream"] = True
        return self._add_images(s, body)

    def _add_images(self, s: "StreamExecutor", body: dict, copies: Optional[int] = None) -> dict:
        """The state's images (each fills one image placeholder of its text, in order); `copies`: a batch of that
        many prompts that all hold them."""
        if s.images_ or s.videos_:
            if not self.model_info.get("has_image_understanding", False):
                raise BackendError(f"the model {self.get_model_name()!r} does not accept images")
        for field, items in (("image_data", [b64 for _src, b64 in s.images_]), ("video_data", [u for _s, u in s.videos_])):
            if items:
                body[field] = items if copies is None else [items] * copies
        return body

    def generate(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> GenResult:
        obj = self._generate(self._gen_body(s, sampling_params, stream=False))
        if isinstance(obj, list):
            return [o["text"] for o in obj], [o["meta_info"] for o in obj]
        return obj["text"], obj["meta_info"]

    def generate_stream(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        if sampling_params.n != 1:
            raise BackendError("streaming supports n=1 only")
        body = self._gen_body(s, sampling_params, stream=True)
        try:
            with self.client.stream("POST", "/generate", json=body) as res:
                if res.status_code >= 400:
                    res.read()
                    _raise_for_status(res, "/generate")
                text_pos = 0
                list_pos = {k: 0 for k in _LIST_META}
                for line in res.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk or chunk.get("object") == "error":
                        raise BackendError(f"/generate stream failed: {chunk}")
                    # The server sends the cumulative text and logprob lists; hand out what is new.
                    text = chunk["text"]
                    meta = dict(chunk.get("meta_info", {}))
                    for k in _LIST_META:
                        if isinstance(meta.get(k), list):
                            full = meta[k]
                            meta[k] = full[list_pos[k]:]
                            list_pos[k] = len(full)
                    yield text[text_pos:], meta
                    text_pos = len(text)
        except httpx.HTTPError as e:
            raise BackendError(f"streaming /generate from {self.base_url} failed: {e!r}") from e

    # ---- select
    def select(self, s: "StreamExecutor", choices: list[str], temperature: float,
               choices_method: ChoicesSamplingMethod) -> ChoicesDecision:
        if temperature > 1e-5:
            raise ValueError(f"select on RuntimeEndpoint is deterministic; temperature must be 0, got {temperature}")
        if not choices:
            raise ValueError("select needs at least one choice")
        # The context alone first: it gets cached, and its token count places the logprob window.
        obj = self._generate(self._add_images(s, {"text": s.text_, "sampling_params": {"max_new_tokens": 0}}))
        prompt_len = obj["meta_info"]["prompt_tokens"]
        # Two tokens early: joining context and choice may merge the context's last token with the choice's
        # first piece (token healing); that merged token must be scored.
        start = max(prompt_len - 2, 0)
        obj = self._generate(self._add_images(s, {
            "text": [s.text_ + c for c in choices],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": start,
        }, copies=len(choices)))
        input_lps = [choice_token_logprobs(s.text_, c, o["meta_info"]["input_token_logprobs"])
                     for c, o in zip(choices, obj)]
        output_lps = [o["meta_info"].get("output_token_logprobs", []) for o in obj]
        normalized = [normalized_logprob(lp) for lp in input_lps]
        unconditional = None
        if choices_method.requires_unconditional_logprobs:
            res = self._generate({"input_ids": [[e[1] for e in lp] for lp in input_lps],
                                  "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                                  "logprob_start_len": 0})
            unconditional = [r["meta_info"]["input_token_logprobs"] for r in res]
        decision = choices_method(choices=choices, normalized_prompt_logprobs=normalized,
                                  input_token_logprobs=input_lps, output_token_logprobs=output_lps,
                                  unconditional_token_logprobs=unconditional)
        decision.meta_info.update(normalized_prompt_logprobs=normalized, input_token_logprobs=input_lps,
                                  output_token_logprobs=output_lps)
        return decision

    def shutdown(self) -> None:
        self.client.close()


def choice_token_logprobs(context: str, choice: str, entries: list) -> list:
    """The entries (logprob, id, text) that score `choice`: leading entries whose text lies wholly inside the
    context are dropped; a token straddling the boundary (healed) is kept. Falls back to SGLang's rule (drop the
    first entry if the context ends with its text) when the token texts do not spell the prompt's tail."""
    full = context + choice
    texts = [e[2] if len(e) > 2 else None for e in entries]
    if entries and all(isinstance(t, str) for t in texts) and full.endswith("".join(texts)):
        pos = len(full) - len("".join(texts))
        i = 0
        while i < len(entries) - 1 and pos + len(texts[i]) <= len(context):
            pos += len(texts[i])
            i += 1
        return [list(e) for e in entries[i:]]
    if len(entries) > 1 and isinstance(texts[0], str) and context.endswith(texts[0]):
        return [list(e) for e in entries[1:]]
    return [list(e) for e in entries]


def _raise_for_status(res: httpx.Response, path: str) -> None:
    if res.status_code < 400:
        return
    try:
        msg = res.json().get("message", res.text)
    except ValueError:
        msg = res.text
    raise BackendError(f"{path} answered HTTP {res.status_code}: {msg}")


def _decode(res: httpx.Response, path: str) -> Union[dict, list]:
    try:
        return res.json()
    except ValueError as e:
        raise BackendError(f"{path} answered with non-JSON: {res.text[:200]!r}") from e
