"""The command line of ServerArgs: one flag per field, grouped by section, plus SGLang's boolean spellings of the
auto|on|off fields; and the inverse, the flags that reproduce a ServerArgs."""
from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from typing import Any

from radixlm.runtime.args.choices import Section, values
from radixlm.runtime.args.server_args import ServerArgs


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def help_text(text: str) -> str:
    """argparse treats help as a %-format string: a literal % must be doubled."""
    return text.replace("%", "%%")


def field_type(tp: Any) -> tuple[Any, tuple[str, ...] | None]:
    """The type a field's flag parses (Optional unwrapped; an enum as str, ServerArgs makes the member) and the
    choices an enum implies."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return str, values(tp)
    return tp, None


def add_server_args(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(ServerArgs)
    groups = {s: parser.add_argument_group(s.value) for s in Section}
    for f in dataclasses.fields(ServerArgs):
        group = groups[f.metadata["section"]]
        flag = flag_of(f.name)
        tp, choices = field_type(hints[f.name])
        # An enum default goes in as its value: argparse would pass a str-mixin member through str() (the name).
        default = f.default.value if isinstance(f.default, enum.Enum) else f.default
        kw = {"default": default, "help": help_text(f.metadata["help"]), "dest": f.name}
        if tp is bool:
            group.add_argument(flag, action="store_true", **kw)
        elif typing.get_origin(tp) is list:
            item = typing.get_args(tp)[0]
            group.add_argument(flag, nargs="+", type=item, metavar=item.__name__.upper(), **kw)
        else:
            choices = f.metadata["choices"] or choices
            group.add_argument(flag, type=tp, choices=choices, metavar=None if choices else tp.__name__.upper(), **kw)
        for spelling, value in f.metadata["sglang_flags"].items():
            group.add_argument(spelling, dest=f.name, action="store_const", const=value.value,
                               default=argparse.SUPPRESS, help=f"SGLang's spelling of {flag} {value.value}")


def server_args_from(ns: argparse.Namespace) -> dict:
    return {f.name: getattr(ns, f.name) for f in dataclasses.fields(ServerArgs)}


def server_argv(args: ServerArgs) -> list[str]:
    """The flags that reproduce `args` (only those that differ from the defaults)."""
    out: list[str] = []
    for f in dataclasses.fields(ServerArgs):
        value = getattr(args, f.name)
        if value == f.default or value is None:
            continue
        flag = flag_of(f.name)
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, value.value if isinstance(value, enum.Enum) else str(value)]
    return out
