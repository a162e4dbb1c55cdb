"""schemathesis over the server's OpenAPI document (positive mode, bounded examples and time): no 5xx and every
response conforms to the documented schema."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.runtime.server.conftest import start_server, stop_server


@pytest.fixture(scope="module")
def server():
    handle = start_server()
    yield handle
    stop_server(handle)


def test_schemathesis_finds_no_server_error_or_schema_violation(server):
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{server.base_url}/openapi.json", "--mode", "positive",
           "--max-examples", "10", "--max-time", "60", "--request-timeout", "30", "--seed", "1",
           "--checks", "not_a_server_error,response_schema_conformance"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert server.client.get("/health").status_code == 200
