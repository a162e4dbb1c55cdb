"""One real SmolLM2 server for every end-to-end test under tests/lang, started through `sgl.Runtime`."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="package")  # stopped when the run leaves tests/lang
def runtime():
    import radixlm as sgl

    rt = sgl.Runtime(max_total_tokens=4096, random_seed=0, enable_integrity_check=True, log_level="warning",
                     launch_timeout=180)
    try:
        yield rt
    finally:
        rt.shutdown()


@pytest.fixture
def backend(runtime):
    return runtime.endpoint
