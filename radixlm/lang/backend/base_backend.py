"""The interface between the interpreter and a model provider. A backend is shared by every stream of a program
(and of a batch), so its methods must be thread-safe."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

from radixlm.lang.chat_template import ChatTemplate, get_chat_template
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.lang.ir import SglSamplingParams

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor

GenResult = tuple[Union[str, list[str]], Union[dict, list[dict]]]


class BackendError(RuntimeError):
    """The model provider refused or failed a request; the message carries its answer."""


class BaseBackend:
    support_concate_and_append: bool = False
    supports_api_speculation: bool = False  # honours `function(num_api_spec_tokens=N)` (paper §5)

    def __init__(self) -> None:
        self.chat_template: ChatTemplate = get_chat_template("default")

    def get_model_name(self) -> str:
        raise NotImplementedError

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    # Prefix-cache hints (no-ops where the provider has no cache to warm).
    def cache_prefix(self, prefix_str: str) -> None:
        pass

    def uncache_prefix(self, rid: str) -> None:
        pass

    def commit_lazy_operations(self, s: "StreamExecutor") -> None:
        pass

    def fill_image(self, s: "StreamExecutor") -> None:
        pass

    def begin_program(self, s: "StreamExecutor") -> None:
        pass

    def end_program(self, s: "StreamExecutor") -> None:
        pass

    def generate(self, s: "StreamExecutor", sampling_params: SglSamplingParams) -> GenResult:
        """(text, meta_info), or lists of both when sampling_params.n > 1."""
        raise NotImplementedError

    def generate_stream(self, s: "StreamExecutor",
                        sampling_params: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        """Yields (new_text, meta_info) per chunk; list fields of meta_info hold this chunk's entries only."""
        raise NotImplementedError

    def select(self, s: "StreamExecutor", choices: list[str], temperature: float,
               choices_method: ChoicesSamplingMethod) -> ChoicesDecision:
        raise NotImplementedError

    def concatenate_and_append(self, src_rids: list[str], dst_rid: str) -> None:
        raise NotImplementedError

    def flush_cache(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no cache to flush")

    def get_server_info(self) -> Optional[dict]:
        raise NotImplementedError(f"{type(self).__name__} has no server info")

    def shutdown(self) -> None:
        pass
