"""Command lines of scripts that hold several benchmarks: `--kind K` picks one, then K's own options are parsed
(`--kind K --help` lists them; without --kind, --help lists the kinds)."""
from __future__ import annotations

import argparse
from enum import Enum
from typing import Callable, Optional, TypeVar

K = TypeVar("K", bound=Enum)


def parse_kind(description: str, kinds: dict[K, Callable[[argparse._ArgumentGroup], None]], default: Optional[K],
               argv: Optional[list[str]] = None) -> argparse.Namespace:
    """args.kind is the Enum member; every kind's options are its own (defaults may differ between kinds)."""
    kind_type = type(next(iter(kinds)))
    choices = [k.value for k in kinds]
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--kind", choices=choices, default=default and default.value)
    known, _ = pre.parse_known_args(argv)
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=choices, default=default and default.value, required=default is None,
                   help="the benchmark; `--kind K --help`: K's options")
    if known.kind is not None:
        kinds[kind_type(known.kind)](p.add_argument_group(f"--kind {known.kind}"))
    args = p.parse_args(argv)
    args.kind = kind_type(args.kind)
    return args
