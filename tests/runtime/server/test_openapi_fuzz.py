"""schemathesis over the server's OpenAPI document (positive mode, bounded examples and time): no 5xx and every
response conforms to the documented schema. Request bodies are generated from the documented models; the
hooks only cap how many tokens a body asks for."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.server.conftest import start_server, stop_server


@pytest.fixture(scope="module")
def server():
    handle = start_server("--context-length", "512")
    yield handle
    stop_server(handle)


def test_schemathesis_finds_no_server_error_or_schema_violation(server):
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{server.base_url}/openapi.json", "--mode", "positive",
           "--max-examples", "10", "--max-time", "60", "--request-timeout", "30", "--seed", "1",
           "--checks", "not_a_server_error,response_schema_conformance"]
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.runtime.server.schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=root, env=env)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert server.client.get("/health").status_code == 200
    # Generated bodies were valid often enough to run generations (not only rejected with 400).
    metrics = server.client.get("/metrics").text
    finished = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("radixlm:num_requests_total"))
    assert finished >= 5, proc.stdout[-3000:]
