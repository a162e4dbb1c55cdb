"""The suite's tiers, set here from what a test uses rather than in its module (modules move; this table follows
their basenames):

- interpreted_kernel: runs Triton kernels under the interpreter in a subprocess (tests/triton_interpret.py);
- real_model: loads SmolLM2 or Qwen2.5-0.5B (their GGUF files), in the test process or in a server it starts;
- server: starts a `radixlm serve`, `sgl.Runtime` or router process.

The fast tier is what has none of them: pytest -m "not interpreted_kernel and not real_model and not server".
A run orders whole modules by their heaviest test, fast tier first (a module's tests stay together, so its fixtures
are built once), and gives memory back to the system after each expensive teardown."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from pathlib import Path

import pytest

from tests import tiers

TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank: dict[Path, int] = {}
    first: dict[Path, int] = {}
    for i, item in enumerate(items):
        names = tiers.tiers_of(item)
        for name in names:
            item.add_marker(name)
        first.setdefault(item.path, i)
        rank[item.path] = max(rank.get(item.path, 0), max((tiers.ORDER.index(n) + 1 for n in names), default=0))
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank[item.path], first[item.path], order[id(item)]))


def _trim() -> None:
    """Frees cycles, and hands freed heap pages back to the system: glibc keeps them otherwise, and a module's
    engines (2-3 GB each) would stay in the process's footprint for the rest of the run."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc():
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "malloc_trim") else None


_LIBC = _libc()
TRIM_AFTER_TEARDOWN_S = 0.05  # a teardown this long finalized something large (an engine, a server)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    t0 = time.monotonic()
    yield
    if nextitem is None or nextitem.path != item.path or time.monotonic() - t0 > TRIM_AFTER_TEARDOWN_S:
        _trim()
