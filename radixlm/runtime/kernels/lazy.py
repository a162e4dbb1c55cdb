"""The sub-packages' lazy names: a Triton kernel's module loads when one of its names is first read."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: names maps a public name to the sub-module that defines it, as "module"
    or, where the sub-module's own name differs, "module:name"."""

    def __getattr__(name: str) -> object:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        value = getattr(importlib.import_module(f"{package}.{module}"), attr or name)
        # Kept on the package: later reads (function-level imports on the forward path) find it without this hook.
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
