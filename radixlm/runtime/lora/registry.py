"""The front's view of the adapters (Engine, TokenizerManager): name -> reference, what requests are checked
against. Each load gets a fresh `lora_id`: the radix cache's namespace, so an adapter unloaded and loaded again under
the same name never reads KV computed with the old weights."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from radixlm.runtime.lora.config import LoraSpec, check_name

NAMESPACE_PREFIX = "lora:"


@dataclass(frozen=True)
class LoraRef:
    lora_id: str
    lora_name: str
    lora_path: str
    pinned: bool = False


def cache_namespace(lora_id: str | None, extra_key: str | None) -> str | None:
    """The radix key's namespace of a request: its adapter's and its own extra_key, never equal across adapters."""
    if lora_id is None:
        return extra_key
    return NAMESPACE_PREFIX + lora_id + ("" if extra_key is None else "|" + extra_key)


def startup_refs(lora_paths: list[str] | None) -> list[LoraRef]:
    """The --lora-paths adapters, with ids the front and the scheduler derive alike (a later load of the same name
    gets a random one)."""
    refs: dict[str, LoraRef] = {}
    for entry in lora_paths or ():
        spec = LoraSpec.parse(entry)
        check_name(spec.name)
        if spec.name in refs:
            raise ValueError(f"--lora-paths names the adapter {spec.name!r} twice")
        refs[spec.name] = LoraRef(f"startup-{len(refs)}", spec.name, spec.path, spec.pinned)
    return list(refs.values())


class LoraRegistry:
    def __init__(self, enabled: bool, refs: list[LoraRef] = ()):
        self.enabled = enabled
        self._refs: dict[str, LoraRef] = {r.lora_name: r for r in refs}
        self._loading: set[str] = set()  # names whose load is under way (taken too)

    def new_ref(self, name, path, pinned: bool = False) -> LoraRef:
        """A reference for an adapter about to load (ValueError: LoRA off, a bad name or one taken)."""
        if not self.enabled:
            raise ValueError("LoRA serving is off: start the server with --enable-lora (or --lora-paths)")
        check_name(name)
        if not isinstance(path, str) or not path:
            raise ValueError(f"lora_path must be a non-empty string, got {path!r}")
        if name in self._refs or name in self._loading:
            raise ValueError(f"a LoRA adapter named {name!r} is loaded already")
        self._loading.add(name)
        return LoraRef(uuid.uuid4().hex, name, path, bool(pinned))

    def finish_load(self, ref: LoraRef, success: bool) -> None:
        """After new_ref's load: registered if it succeeded; the name is free again either way."""
        self._loading.discard(ref.lora_name)
        if success:
            self._refs[ref.lora_name] = ref

    def remove(self, name) -> LoraRef:
        """Takes the adapter out of what requests may name (ValueError if none is loaded under that name)."""
        if not self.enabled:
            raise ValueError("LoRA serving is off: start the server with --enable-lora (or --lora-paths)")
        ref = self._refs.pop(name, None) if isinstance(name, str) else None
        if ref is None:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded")
        return ref

    def resolve(self, name) -> str | None:
        """A request's lora_path (an adapter's name; None: the base model) -> its lora_id."""
        if name is None:
            return None
        if not isinstance(name, str):
            raise ValueError(f"lora_path must be an adapter's name (a string), got {name!r}")
        if not self.enabled:
            raise ValueError("LoRA serving is off: start the server with --enable-lora (or --lora-paths)")
        ref = self._refs.get(name)
        if ref is None:
            raise ValueError(f"unknown LoRA adapter {name!r}; loaded: {sorted(self._refs)}")
        return ref.lora_id

    def adapter_of_model(self, model: str | None, served: str) -> str | None:
        """The adapter an OpenAI `model` names: an adapter's name, or SGLang's `base:adapter`; None: the base model
        (its own name, or anything not naming an adapter: the served model answers)."""
        if not self.enabled or not model:
            return None
        if model in self._refs:
            return model
        base, sep, adapter = model.rpartition(":")
        if sep and adapter in self._refs:
            return adapter
        if sep and base and adapter:
            raise ValueError(f"unknown LoRA adapter {adapter!r} in model {model!r}; loaded: {sorted(self._refs)}")
        return None

    def loaded(self) -> dict[str, str]:
        """name -> path of every adapter (SGLang's loaded_adapters)."""
        return {r.lora_name: r.lora_path for r in self._refs.values()}

    def refs(self) -> list[LoraRef]:
        return list(self._refs.values())
