"""How many threads a test process gives torch (tests/conftest.py sets it in each xdist worker)."""
from __future__ import annotations

import os


def worker_threads() -> int:
    """Torch threads for a test process: the machine's cores over the run's xdist workers. More oversubscribe the cores:
    on 2 cores beside one busy process, an engine's ten 16-token requests took 37 s with 2 threads, 14 s with 1."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, len(os.sched_getaffinity(0)) // workers)
