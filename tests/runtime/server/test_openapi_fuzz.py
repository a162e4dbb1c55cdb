"""schemathesis over the server's OpenAPI document, in positive and negative modes, every operation (the coverage
phase within a time budget, fuzzing a fixed number of cases each): no 5xx but a 503, and every response (status
code, content type, body, headers) as documented. Bodies are generated from the documented models; the hooks
(schemathesis_hooks.py) cap the work each one asks for."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runtime.server.conftest import start_server, stop_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
CONTEXT_LEN = 512
# Two runs. The coverage phase (schemathesis's systematic cases: 6,617 of them at --mode all, ~220 s on 2 cores) gets
# a time budget, which the run splits evenly over the operations: it tests less on a slow machine. The fuzzing and
# stateful phases get fixed work instead, FUZZ_EXAMPLES cases an operation, whatever the machine's speed, and the test
# checks that every documented operation was fuzzed (a time budget there left operations unfuzzed under load).
COVERAGE_TIME_S = 30
FUZZ_EXAMPLES = 10
RUN_TIMEOUT_S = 900  # a deadline against a hang only
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "response_headers_conformance")
# A 503 (busy, starting) is a documented answer, not a server error.
CONFIG = '[checks.not_a_server_error]\nexpected-statuses = ["2xx", "3xx", "4xx", "503"]\n'


@pytest.fixture(scope="module")
def server():
    handle = start_server("--context-length", str(CONTEXT_LEN))
    yield handle
    stop_server(handle)


def _finished_requests(server) -> float:
    metrics = server.client.get("/metrics").text
    return next(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("radixlm:num_requests_total"))


def _failures(output: str) -> str:
    """The FAILURES section (each failure with the curl command that reproduces it), else the tail."""
    match = re.search(r"=+ FAILURES =+\n(.*?)\n=+ (?:WARNINGS|SUMMARY) =+", output, re.S)
    return match.group(1) if match else output[-6000:]


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 10**9}}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1e9}}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 8, "n": 10**9}}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1e9, "n": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1e9}),
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}),
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e9}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 10**9}),
])
def test_requests_for_unbounded_work_are_refused(server, path, body):
    """What the hooks do not cap (a negative-mode body) cannot make a generation run long: the server refuses
    more tokens than the context holds, and more samples than 128, before anything runs."""
    started = time.monotonic()
    r = server.client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert time.monotonic() - started < 10


def _phase_passed(output: str, phase: str) -> int:
    """How many operations the run's report counts as passed in `phase` (0 where the phase ran none)."""
    match = re.search(rf"{phase} \(in [\d.]+s\)\s+\S+\s+(\d+) passed", output)
    return int(match.group(1)) if match else 0


def _run(server, tmp_path, phases: str, limit: list[str]) -> str:
    """One schemathesis run of these phases (positive and negative cases) over every operation; its report (the run
    passed)."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
           f"{server.base_url}/openapi.json", "--phases", phases, "--mode", "all", "--checks", CHECKS, "--seed", "1",
           *limit, "--request-timeout", "60", "--workers", "1", "--generation-database", "none",
           "--output-sanitize", "false", "--no-color"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.runtime.server.schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=env)
    print(proc.stdout[-2500:])  # the run's summary (pytest -rP shows it)
    assert proc.returncode == 0, _failures(proc.stdout) + proc.stderr[-2000:]
    return proc.stdout


def test_schemathesis_finds_no_server_error_or_schema_violation(server, tmp_path):
    operations = sum(method in ("get", "post", "put", "patch", "delete")
                     for item in server.client.get("/openapi.json").json()["paths"].values() for method in item)
    before = _finished_requests(server)
    _run(server, tmp_path, "examples,coverage", ["--max-time", str(COVERAGE_TIME_S)])
    report = _run(server, tmp_path, "fuzzing,stateful", ["--max-examples", str(FUZZ_EXAMPLES)])
    assert re.search(rf"Tested: {operations}\n", report), report[-3000:]
    assert _phase_passed(report, "Fuzzing") == operations, report[-3000:]
    assert server.proc.poll() is None, "the server exited during the fuzz run"
    assert server.client.get("/health").status_code == 200
    r = server.client.post("/generate", json={"text": "The capital of France is",
                                              "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4, r.text
    # Generated bodies were valid often enough to run generations (not only rejected with 400).
    assert _finished_requests(server) - before >= 20
