"""Chat templates as role prefixes and suffixes, which is what an incrementally built prompt needs.

A backend picks one by name, by the model path, or from the model's own (Jinja) template source: a ChatML
template is recognised by its markers, and its hard-coded default system prompt is taken over."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from enum import Enum, auto
from typing import Callable, Optional, Union


class ChatTemplateStyle(Enum):
    PLAIN = auto()
    LLAMA2 = auto()  # the first system message goes inside the first user turn ([INST] <<SYS>>...<</SYS>> ...)


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    default_system_prompt: Optional[str]
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    stop_str: tuple[str, ...] = ()
    image_token: str = "<image>"
    video_token: str = "<video>"
    audio_token: str = "<audio>"
    style: ChatTemplateStyle = ChatTemplateStyle.PLAIN

    def get_prefix_and_suffix(self, role: str, hist_messages: list[dict]) -> tuple[str, str]:
        try:
            prefix, suffix = self.role_prefix_and_suffix[role]
        except KeyError:
            raise ValueError(f"chat template {self.name!r} has no role {role!r}") from None
        if self.style == ChatTemplateStyle.LLAMA2:
            if role == "system" and not hist_messages:
                return self.role_prefix_and_suffix["user"][0] + prefix, suffix
            if role == "user" and len(hist_messages) == 1 and hist_messages[0]["role"] == "system" \
                    and hist_messages[0]["content"] is not None:
                return "", suffix  # the user turn was opened by the system message (None: a skipped default)
        return prefix, suffix

    def get_prompt(self, messages: list[dict]) -> str:
        """The messages rendered as given, as SGLang's get_prompt: a system message whose content is None stands
        for the default system prompt (skipped when there is none); nothing is added."""
        out = ""
        for i, m in enumerate(messages):
            content = m["content"]
            if m["role"] == "system" and content is None:
                content = self.default_system_prompt
                if content is None:
                    continue
            pre, suf = self.get_prefix_and_suffix(m["role"], messages[:i])
            out += pre + content + suf
        return out

    def get_generation_prompt(self, messages: list[dict]) -> str:
        """What a model's chat template gives with add_generation_prompt: the default system prompt first where the
        messages have no system message, then the messages, then the assistant's prefix."""
        if self.default_system_prompt is not None and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": None}, *messages]
        return self.get_prompt(messages) + self.get_prefix_and_suffix("assistant", messages)[0]


def message_content(text: str, begin: int, media: list[tuple[int, str, str]],
                    template: "ChatTemplate") -> Union[str, list[dict]]:
    """A role's message from the program's text from `begin` on: the text, or with media OpenAI's content parts in
    order, each image or video (whose token the text holds at its recorded position) an image_url or video_url part
    in its token's place."""
    if not media:
        return text[begin:].lstrip()
    parts: list[dict] = []
    pos = begin
    for at, kind, url in media:
        piece = text[pos:at] if parts else text[pos:at].lstrip()
        if piece:
            parts.append({"type": "text", "text": piece})
        parts.append({"type": kind, kind: {"url": url}})
        pos = at + len(template.image_token if kind == "image_url" else template.video_token)
    if text[pos:]:
        parts.append({"type": "text", "text": text[pos:]})
    return parts


@dataclass
class ChatTemplateRegistry:
    """Named templates plus model-path matchers (first match wins). One instance, `chat_template_registry`,
    holds the built-ins; register your own on it or build a fresh registry."""

    templates: dict[str, ChatTemplate] = field(default_factory=dict)
    matchers: list[Callable[[str], Union[str, ChatTemplate, None]]] = field(default_factory=list)

    def register(self, template: ChatTemplate) -> None:
        self.templates[template.name] = template

    def register_matcher(self, fn: Callable[[str], Union[str, ChatTemplate, None]]) -> None:
        """`fn(model_path)` gives a template, or its name, or None when the path is not its model's."""
        self.matchers.append(fn)

    def get(self, name: str) -> ChatTemplate:
        try:
            return self.templates[name]
        except KeyError:
            raise ValueError(f"unknown chat template {name!r}; known: {sorted(self.templates)}") from None

    def by_model_path(self, model_path: str) -> ChatTemplate:
        for fn in self.matchers:
            found = fn(model_path)
            if isinstance(found, ChatTemplate):
                return found
            if found is not None:
                return self.get(found)
        return self.get("default")


ROLES = ("system", "user", "assistant")


def _chatml(name: str, system: Optional[str]) -> ChatTemplate:
    roles = {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ROLES}
    return ChatTemplate(name, system, roles, stop_str=("<|im_end|>",))


VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                 "helpful, detailed, and polite answers to the user's questions.")


def builtin_registry() -> ChatTemplateRegistry:
    reg = ChatTemplateRegistry()
    reg.register(ChatTemplate("default", None, {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"),
                                               "assistant": ("ASSISTANT:", "\n")}))
    reg.register(ChatTemplate("claude", None, {"system": ("", ""), "user": ("\n\nHuman: ", ""),
                                              "assistant": ("\n\nAssistant:", "")}))
    reg.register(_chatml("chatml", None))
    reg.register(_chatml("smollm2", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"))
    reg.register(_chatml("qwen", "You are a helpful assistant."))
    reg.register(_chatml("qwen2.5", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."))
    reg.register(replace(_chatml("qwen2-vl", "You are a helpful assistant."),
                         image_token="<|vision_start|><|image_pad|><|vision_end|>"))
    reg.register(replace(_chatml("chatml-llava", "You are a helpful assistant."), image_token="<image>\n"))
    llama3 = {r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>") for r in ROLES}
    for name, image_token in (("llama-3-instruct", "<|image|>"), ("llama-3-instruct-llava", "<image>\n")):
        reg.register(ChatTemplate(name, None, llama3, stop_str=("<|eot_id|>",), image_token=image_token))
    reg.register(ChatTemplate("llama-4", None, {
        r: (f"<|header_start|>{r}<|header_end|>\n\n", "<|eot|>") for r in ROLES
    }, stop_str=("<|eot|>",), image_token="<|image|>"))
    reg.register(ChatTemplate("llama-2-chat", None, {"system": ("<<SYS>>\n", "\n<</SYS>>\n\n"),
                                                    "user": ("[INST] ", " [/INST]"), "assistant": ("", " </s><s>")},
                              style=ChatTemplateStyle.LLAMA2))
    reg.register(ChatTemplate("mistral", None, {"system": ("[SYSTEM_PROMPT] ", " [/SYSTEM_PROMPT]"),
                                               "user": ("[INST] ", " [/INST]"), "assistant": ("", " </s><s>")},
                              stop_str=("</s>",), image_token="[IMG]"))
    reg.register(ChatTemplate("vicuna_v1.1", VICUNA_SYSTEM, {"system": ("", " "), "user": ("USER:", " "),
                                                            "assistant": ("ASSISTANT:", "</s>")},
                              image_token=" <image>\n"))
    reg.register(ChatTemplate("gemma-it", None, {"system": ("", ""),
                                                "user": ("<start_of_turn>user\n", "<end_of_turn>\n"),
                                                "assistant": ("<start_of_turn>model\n", "<end_of_turn>\n")}))
    minicpm = {"system": ("", " "), "user": ("user:", " "), "assistant": ("assistant:", "</s>")}
    reg.register(ChatTemplate("minicpmv", None, minicpm, stop_str=("<|im_end|>", "<|endoftext|>"),
                              image_token="(<image>./</image>)"))
    reg.register(ChatTemplate("minicpmo", None, minicpm, stop_str=("<|im_end|>", "<|endoftext|>"),
                              image_token="(<image>./</image>)", audio_token="(<audio>./</audio>)"))
    deepseek = {"system": ("", ""), "user": ("<｜User｜>", ""),
                "assistant": ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")}
    reg.register(ChatTemplate("deepseek-v3", None, deepseek, stop_str=("<｜end▁of▁sentence｜>",)))
    for name in ("janus", "janus-pro"):
        reg.register(ChatTemplate(name, None, deepseek, stop_str=("<｜end▁of▁sentence｜>",),
                                  image_token="<image_placeholder>\n"))
    reg.register(ChatTemplate("yi-1.5", None, {"system": ("", ""),
                                              "user": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
                                              "assistant": ("", "<|im_end|>\n")}, stop_str=("<|im_end|>",)))
    reg.register(ChatTemplate("c4ai-command-r", None, {
        r: (f"<|START_OF_TURN_TOKEN|><|{t}_TOKEN|>", "<|END_OF_TURN_TOKEN|>")
        for r, t in (("system", "SYSTEM"), ("user", "USER"), ("assistant", "CHATBOT"))}))
    reg.register(ChatTemplate("granite-3-instruct", None, {
        r: (f"<|start_of_role|>{r}<|end_of_role|>", "<|end_of_text|>") for r in ROLES
    }, stop_str=("<|end_of_text|>",)))
    reg.register(ChatTemplate("glm-4v", None, {r: (f"<|{r}|>\n", "\n") for r in ROLES},
                              stop_str=("<|user|>", "<|endoftext|>", "<|observation|>"), image_token="<|image|>"))
    reg.register_matcher(_match_builtin)
    return reg


def _match_builtin(model_path: str) -> Optional[str]:
    p = model_path.lower()
    # "default" is radixlm's name for SmolLM2-135M-Instruct (see ServerArgs.model_path).
    if p == "default" or "smollm" in p:
        return "smollm2"
    if "qwen" in p:
        if "vl" in p:
            return "qwen2-vl"
        return "qwen2.5" if "qwen2.5" in p or "qwen2_5" in p else "qwen"
    if "llama-3" in p or "llama3" in p:
        return "llama-3-instruct"
    if ("llama-2" in p and "chat" in p) or (("mistral" in p or "mixtral" in p) and "instruct" in p):
        return "llama-2-chat"
    if "vicuna" in p or "llava-v1.5" in p:
        return "vicuna_v1.1"
    if "gemma" in p and "it" in p.split("-"):
        return "gemma-it"
    if "claude" in p:
        return "claude"
    return None


_SYSTEM_LITERAL = re.compile(r"<\|im_start\|>system\n([^'\"{}+\\]+?)<\|im_end\|>")


def template_from_jinja(source: str, name: str = "from-tokenizer") -> Optional[ChatTemplate]:
    """Recognises a model's own Jinja chat template; None when its family is unknown."""
    if "<|im_start|>" in source:
        m = _SYSTEM_LITERAL.search(source)
        return _chatml(name, m.group(1) if m else None)
    if "<|start_header_id|>" in source:
        return builtin_registry().get("llama-3-instruct")
    return None


def read_local_jinja(tokenizer_path: str) -> Optional[str]:
    """The chat template source of a tokenizer directory on this machine, if there is one."""
    if not tokenizer_path or not os.path.isdir(tokenizer_path):
        return None
    jinja = os.path.join(tokenizer_path, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    cfg = os.path.join(tokenizer_path, "tokenizer_config.json")
    if os.path.isfile(cfg):
        try:
            with open(cfg, encoding="utf-8") as f:
                tpl = json.load(f).get("chat_template")
        except (OSError, ValueError):
            return None
        return tpl if isinstance(tpl, str) else None
    return None


chat_template_registry = builtin_registry()


def get_chat_template(name: str) -> ChatTemplate:
    return chat_template_registry.get(name)


def get_chat_template_by_model_path(model_path: str) -> ChatTemplate:
    return chat_template_registry.by_model_path(model_path)


def register_chat_template(template: ChatTemplate) -> None:
    chat_template_registry.register(template)


def register_chat_template_matching_function(fn: Callable[[str], Union[str, ChatTemplate, None]]) -> Callable:
    """Usable as a decorator, as in SGLang. Functions registered later are asked after the built-in ones."""
    chat_template_registry.register_matcher(fn)
    return fn
