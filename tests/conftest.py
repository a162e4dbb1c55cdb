"""The suite's tiers, set here from what a test uses rather than in its module (modules move; this table follows
their basenames):

- interpreted_kernel: runs Triton kernels under the interpreter in a subprocess (tests/triton_interpret.py);
- real_model: loads SmolLM2 or Qwen2.5-0.5B (their GGUF files), in the test process or in a server it starts;
- server: starts a `radixlm serve`, `sgl.Runtime` or router process.

The fast tier is what has none of them: pytest -m "not interpreted_kernel and not real_model and not server".
A run orders whole modules by their heaviest test, fast tier first (a module's tests stay together, so its fixtures
are built once), within a tier the modules known to be slow first (tests/tiers.py's SLOW_MODULES), and
hands freed memory back to the system after each test. Under pytest-xdist (the README's `-n 2`) pyproject's
`--dist loadfile` keeps a module on one worker, and a worker gives torch (and the processes it starts, through
OMP_NUM_THREADS) the machine's cores over the workers (tests/threads.py)."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import time
from pathlib import Path

import pytest

from tests import tiers, triton_interpret
from tests.threads import worker_threads


# The modules with an interpreted-kernel test: after the last of them a test process closes its interpreter hosts.
INTERPRETED_PATHS = pytest.StashKey[set]()


def pytest_configure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # an xdist worker: so do the processes it starts (OMP_NUM_THREADS)
        import torch

        os.environ.setdefault("OMP_NUM_THREADS", str(worker_threads()))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank: dict[Path, int] = {}
    first: dict[Path, int] = {}
    interpreted = config.stash.setdefault(INTERPRETED_PATHS, set())
    for i, item in enumerate(items):
        names = tiers.tiers_of(item)
        for name in names:
            item.add_marker(name)
        if tiers.INTERPRETED_KERNEL in names:
            interpreted.add(item.path)
        first.setdefault(item.path, i)
        rank[item.path] = max(rank.get(item.path, 0), max((tiers.ORDER.index(n) + 1 for n in names), default=0))
    order = {id(item): i for i, item in enumerate(items)}
    # The modules that share a package-scoped fixture move together (it is then built once per worker).
    group = {item.path: _package_fixture_home(item) or str(item.path) for item in items}
    seconds: dict[str, int] = {}
    group_first: dict[str, int] = {}
    for path, key in group.items():
        seconds[key] = max(seconds.get(key, 0), tiers.module_seconds(path.as_posix()))
        group_first[key] = min(group_first.get(key, first[path]), first[path])
    items.sort(key=lambda item: (rank[item.path], -seconds[group[item.path]], group_first[group[item.path]],
                                 first[item.path], order[id(item)]))


def _package_fixture_home(item: pytest.Item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    homes = sorted(fd.baseid for defs in (info.name2fixturedefs.values() if info else ()) for fd in defs
                   if fd.scope == "package")
    return homes[0] if homes else None


@pytest.fixture(scope="session")
def shared_runtime():
    """One `radixlm serve` with start_server's defaults, started through `sgl.Runtime` (so every run launches one the
    way the language's users do), for the modules that need no other configuration and leave it running (a start-up
    is 5-8 s on 2 cores): tests/lang's end-to-end modules and, as shared_server, the server tier's; a module that ends
    or reconfigures its server starts its own."""
    import radixlm as sgl
    from tests.runtime.server.conftest import SERVER_THREADS, STARTUP_TIMEOUT_S

    with pytest.MonkeyPatch.context() as mp:  # the server inherits start_server's thread count
        mp.setenv("OMP_NUM_THREADS", SERVER_THREADS)
        rt = sgl.Runtime(max_total_tokens=4096, random_seed=0, enable_integrity_check=True, log_level="warning",
                         launch_timeout=STARTUP_TIMEOUT_S)
    try:
        yield rt
    finally:
        rt.shutdown()


@pytest.fixture(scope="session")
def shared_server(shared_runtime):
    """shared_runtime as a ServerHandle (tests/runtime/server/conftest.py's start_server gives the same server)."""
    import httpx

    from tests.runtime.server.conftest import ServerHandle

    with httpx.Client(base_url=shared_runtime.url, timeout=60) as client:
        yield ServerHandle(shared_runtime.proc, shared_runtime.url, client)


@pytest.fixture(scope="session")
def hf_gguf_model():
    """A loader of transformers' float32 model of a GGUF file (its own dequantizer), converted once per file and
    version and kept between runs (tests/hf_gguf.py)."""
    from tests.hf_gguf import load_hf_gguf

    return load_hf_gguf


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


def _libc():
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "malloc_trim") else None


_LIBC = _libc()
# A teardown this long finalized something large (an engine, a server); so did a test that grew the process this much.
# gc.collect takes 0.3 s in this process, too long to run after every test.
COLLECT_AFTER_TEARDOWN_S = 0.05
COLLECT_AFTER_GROWTH_BYTES = 512 << 20
_collected_at = {"rss": 0}
# A file to append "pid rss_mb nodeid" to after each test (finding what holds a worker's memory); unset: nothing.
RSS_LOG = os.environ.get("RADIXLM_TEST_RSS_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Hands freed memory back to the system: glibc keeps freed heap pages, and a module's engines (2-3 GB each)
    would otherwise stay in the process's footprint for the rest of the run."""
    t0 = time.monotonic()
    yield
    long_teardown = time.monotonic() - t0 > COLLECT_AFTER_TEARDOWN_S
    if long_teardown or _rss_bytes() > _collected_at["rss"] + COLLECT_AFTER_GROWTH_BYTES:
        gc.collect()
        _collected_at["rss"] = _rss_bytes()
    if item.path in item.config.stash.get(INTERPRETED_PATHS, ()) and (
            nextitem is None or nextitem.path not in item.config.stash[INTERPRETED_PATHS]):
        triton_interpret.close_hosts()  # the tier's modules run together: the hosts are not needed again
    if _LIBC is not None:
        _LIBC.malloc_trim(0)  # 0.1 ms
    if RSS_LOG:
        with open(RSS_LOG, "a") as f:
            f.write(f"{os.getpid()} {_rss_bytes() >> 20} {item.nodeid}\n")
