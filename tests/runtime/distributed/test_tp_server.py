"""`radixlm serve --tp-size 2` on CPU (gloo) answers over HTTP exactly as one rank does, also with its two ranks on two
"nodes" (--nnodes 2 on localhost); a rank that dies or hangs fails the pending requests with a 500 and the server
exits non-zero instead of waiting in a collective."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
from transformers import Qwen2Config

from radixlm.bench.procs import stop
from radixlm.runtime.ipc import die_with_parent
from tests.runtime.distributed.test_tensor_parallel import COMMON, NEW_TOKENS, PROMPT_LENS, VOCAB, _engine
from tests.runtime.models.tiny import random_prompts, save_tiny, word_tokenizer
from tests.runtime.server.conftest import child_pids, free_port, start_server, stop_server

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(server args for the checkpoint, prompts, TP=1's greedy answers through the offline Engine)."""
    path = tmp_path_factory.mktemp("qwen2-tp")
    save_tiny(Qwen2Config(**COMMON, tie_word_embeddings=False), path, seed=5)
    # Beside a Qwen2 config transformers loads Qwen2's tokenizer class, which finds no word in the server's warm-up
    # prompt; alone in its directory, the word-level tokenizer maps them to t0.
    word_tokenizer(path / "tokenizer", VOCAB)
    prompts = random_prompts(8, PROMPT_LENS, VOCAB)
    engine = _engine(path)
    try:
        expected = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    finally:
        engine.shutdown()
    return ["--model-path", str(path), "--tokenizer-path", str(path / "tokenizer")], prompts, expected


def _answers(client: httpx.Client, prompts) -> list[list[int]]:
    r = client.post("/generate", json={"input_ids": prompts, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    return [o["output_ids"] for o in r.json()]


def _stream_broken_by(base_url: str, act) -> str:
    """Streams a long generation and calls act() at its first chunk; returns the stream's error message."""
    body = {"input_ids": [5, 6, 7], "stream": True, "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
    with httpx.stream("POST", f"{base_url}/generate", json=body, timeout=120) as r:
        assert r.status_code == 200
        acted = False
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data:"):])
            if "error" in chunk:
                assert acted
                return chunk["error"]["message"]
            assert chunk["meta_info"]["finish_reason"] is None, "finished before the rank was stopped"
            if not acted:
                act()
                acted = True
    raise AssertionError("the stream ended without an error")


def test_tp2_server_answers_as_tp1_and_dies_with_a_rank(tiny):
    model, prompts, expected = tiny
    h = start_server(*model, "--tp-size", "2")
    try:
        info = h.client.get("/server_info").json()
        assert (info["tp_size"], info["ep_size"], info["dp_size"]) == (2, 1, 1)
        assert _answers(h.client, prompts) == expected
        rank1 = info["process_pids"]["scheduler-rank1"]
        assert "scheduler-rank1 process exited" in _stream_broken_by(h.base_url, lambda: os.kill(rank1, signal.SIGKILL))
        assert h.proc.wait(timeout=60) == 1
    finally:
        stop_server(h)


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace")


def test_two_nodes_on_localhost_and_a_hung_rank(tiny):
    """Node 1 runs rank 1 only (no HTTP server); rank 1 stopped (SIGSTOP) mid-request: the watchdog fails the request
    and the server exits."""
    model, prompts, expected = tiny
    addr = f"127.0.0.1:{free_port()}"
    common = [*model, "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr,
              # A pass of this tiny model takes milliseconds: 10 s is margin enough on a busy machine, and the test
              # waits it out once.
              "--watchdog-timeout", "10", "--dist-timeout", "600"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    node1 = subprocess.Popen([sys.executable, "-m", "radixlm.launch_server", *common, "--node-rank", "1",
                              "--max-total-tokens", "4096", "--random-seed", "0"], env=env, preexec_fn=die_with_parent)
    h = None
    try:
        h = start_server(*common, "--node-rank", "0")
        assert _answers(h.client, prompts) == expected
        (rank1,) = [pid for pid in child_pids(node1.pid) if "resource_tracker" not in _cmdline(pid)]
        try:
            assert "watchdog" in _stream_broken_by(h.base_url, lambda: os.kill(rank1, signal.SIGSTOP))
            assert h.proc.wait(timeout=60) == 1
        finally:
            os.kill(rank1, signal.SIGCONT)
    finally:
        if h is not None:
            stop_server(h)
        stop(node1)
