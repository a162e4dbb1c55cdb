"""One real SmolLM2 server for every end-to-end test under tests/lang, started through `sgl.Runtime` (the session's
shared one)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def runtime(shared_runtime):
    """The session's `sgl.Runtime` (tests/conftest.py: the server tier's shared server too)."""
    assert shared_runtime.proc.poll() is None, f"the shared runtime exited with {shared_runtime.proc.returncode}"
    return shared_runtime


@pytest.fixture
def backend(runtime):
    return runtime.endpoint
