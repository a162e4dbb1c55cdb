"""VertexAI: Google's Gemini models through the `vertexai` SDK, as SGLang's `sgl.VertexAI`.

The project comes from $GCP_PROJECT_ID (and $GCP_LOCATION). The state's finished turns are sent as Gemini contents
(a system turn becomes a user turn "System prompt: ..." answered "Understood.", as Gemini has no system role here;
images travel inline); a program without roles sends its text, images in their places. No logprobs: no select."""
from __future__ import annotations

import base64
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Optional

from radixlm.lang.backend.base_backend import BackendError, BaseBackend, GenResult
from radixlm.lang.chat_template import get_chat_template
from radixlm.lang.ir import SglSamplingParams, _as_list

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor


def _sdk() -> Any:
    try:
        import vertexai
        from vertexai.preview import generative_models
    except ImportError as e:
        raise ImportError("sgl.VertexAI needs the google-cloud-aiplatform package (import vertexai)") from e
    return vertexai, generative_models


class VertexAI(BaseBackend):
    def __init__(self, model_name: str, safety_settings: Optional[Any] = None) -> None:
        super().__init__()
        vertexai, self._gm = _sdk()
        project = os.environ.get("GCP_PROJECT_ID")
        if not project:
            raise ValueError("sgl.VertexAI needs the GCP_PROJECT_ID environment variable (and optionally "
                             "GCP_LOCATION)")
        vertexai.init(project=project, location=os.environ.get("GCP_LOCATION"))
        self.model_name = model_name
        self.chat_template = get_chat_template("default")
        self.safety_settings = safety_settings

    def get_model_name(self) -> str:
        return self.model_name

    def _config(self, sp: SglSamplingParams) -> Any:
        if sp.regex is not None or sp.json_schema is not None or sp.dtype is not None:
            raise BackendError("regex/json_schema/dtype constraints need RuntimeEndpoint; the VertexAI backend "
                               "cannot constrain decoding")
        if sp.n != 1:
            raise BackendError("the VertexAI backend generates one sample per gen (n=1)")
        return self._gm.GenerationConfig(candidate_count=1, max_output_tokens=sp.max_new_tokens,
                                         stop_sequences=_as_list(sp.stop) or None, temperature=sp.temperature,
                                         top_p=sp.top_p, top_k=sp.top_k if sp.top_k > 0 else None)

    def _contents(self, s: "StreamExecutor") -> Any:
        if s.messages_:
            return [turn for m in s.messages_ for turn in _turns(m)]
        if not s.images_:
            return s.text_
        # Text and images in order: the text holds one image token per image.
        pieces = s.text_.split(self.chat_template.image_token)
        out: list[Any] = []
        for i, piece in enumerate(pieces):
            if piece:
                out.append(piece)
            if i < len(s.images_):
                out.append(self._gm.Image.from_bytes(base64.b64decode(s.images_[i][1])))
        return out

    def _call(self, s: "StreamExecutor", sp: SglSamplingParams, stream: bool) -> Any:
        if s.videos_:
            raise BackendError("the VertexAI backend does not send videos")
        model = self._gm.GenerativeModel(self.model_name)
        kw = {"stream": True} if stream else {}
        return model.generate_content(self._contents(s), generation_config=self._config(sp),
                                      safety_settings=self.safety_settings, **kw)

    def generate(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> GenResult:
        return self._call(s, sampling_params, stream=False).text, {}

    def generate_stream(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        for piece in self._call(s, sampling_params, stream=True):
            yield piece.text, {}

    def select(self, s, choices, temperature, choices_method):
        raise BackendError("select needs prompt token logprobs, which the VertexAI backend does not return")


def _turns(message: dict) -> list[dict]:
    """One OpenAI-style message as Gemini contents."""
    content = message["content"]
    parts: list[dict] = []
    for part in ([{"type": "text", "text": content}] if isinstance(content, str) else content):
        if part["type"] == "text":
            parts.append({"text": part["text"]})
        elif part["type"] == "image_url":
            head, data = part["image_url"]["url"].split(",", 1)
            parts.append({"inline_data": {"data": data, "mime_type": head[len("data:"):].split(";")[0]}})
        else:
            raise BackendError(f"the VertexAI backend cannot send a {part['type']} part")
    role = message["role"]
    if role == "system":
        warnings.warn("VertexAI has no system role here: the system message is sent as a user turn")
        text = "".join(p.get("text", "") for p in parts)
        return [{"role": "user", "parts": [{"text": "System prompt: " + text}]},
                {"role": "model", "parts": [{"text": "Understood."}]}]
    return [{"role": "model" if role == "assistant" else "user", "parts": parts}]
