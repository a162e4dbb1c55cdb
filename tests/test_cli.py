"""`--help` of every command-line entry point runs (in a subprocess, as a user would) and every flag has a help."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from radixlm.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
HELP_TIMEOUT_S = 120
MAX_HELP_CHARS = 170


def console_scripts() -> dict[str, str]:
    """pyproject's [project.scripts]: command -> "module:function"."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def main_modules() -> list[str]:
    """Every module under radixlm/ that runs as `python -m` (a __main__.py, or an `if __name__ == "__main__"`)."""
    found = set()
    for path in (ROOT / "radixlm").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path.name == "__main__.py" or re.search(r"^if __name__ == .__main__.:", text, re.M):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.add(".".join(parts[:-1] if path.name == "__main__.py" else parts))
    return sorted(found)


def subcommands() -> list[str]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    return []


def _script_cmd(target: str) -> list[str]:
    module, func = target.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


def _commands() -> list[tuple[str, list[str]]]:
    cmds = []
    for name, target in console_scripts().items():
        cmds.append((name, _script_cmd(target)))
        cmds += [(f"{name} {sub}", [*_script_cmd(target), sub]) for sub in subcommands()]
    cmds += [(f"python -m {m}", [sys.executable, "-m", m]) for m in main_modules()]
    return cmds


def test_the_known_entry_points_are_found():
    mods = main_modules()
    for m in ("radixlm.launch_server", "radixlm.router", "radixlm.bench.serving", "radixlm.cli"):
        assert m in mods
    assert console_scripts()["radixlm"] == "radixlm.cli:main"
    assert {"generate", "serve", "router"} <= set(subcommands())


@pytest.mark.parametrize("name, cmd", _commands(), ids=[n for n, _ in _commands()])
def test_help_exits_zero_with_output(name, cmd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=HELP_TIMEOUT_S, cwd=ROOT, env=env)
    assert out.returncode == 0, f"{name} --help: exit {out.returncode}\n{out.stderr[-3000:]}"
    assert out.stdout.strip(), f"{name} --help printed nothing"


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [("radixlm", parser), *((f"radixlm {n}", p) for n, p in subs.choices.items())]


@pytest.mark.parametrize("name, parser", _parsers(), ids=[n for n, _ in _parsers()])
def test_every_flag_has_a_one_line_help(name, parser):
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flag = "/".join(action.option_strings) or action.dest
        assert action.help, f"{name} {flag} has no help"
        assert "\n" not in action.help and len(action.help) <= MAX_HELP_CHARS, f"{name} {flag}: help too long"
