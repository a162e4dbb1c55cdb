"""The serving benchmark: exact dataset lengths (no server) and a tiny end-to-end run against radixlm."""
from __future__ import annotations

import json
import random

import pytest

from radixlm.bench.datasets import PromptSource, build_dataset
from radixlm.bench.metrics import RequestResult, summarize
from radixlm.bench.serving import StreamTimer

GSP = dict(gsp_num_groups=2, gsp_prompts_per_group=3, gsp_system_prompt_len=24, gsp_question_len=6, gsp_output_len=5)


@pytest.fixture(scope="module")
def tokenizer():
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer

    return get_tokenizer("default")


def test_random_lengths(tokenizer):
    reqs = build_dataset("random", tokenizer, 20, 0, random_input_len=50, random_output_len=10, random_range_ratio=0.5)
    assert len(reqs) == 20
    for r in reqs:
        assert 25 <= r.prompt_len <= 50 and 5 <= r.output_len <= 10
        assert len(r.input_ids) == r.prompt_len
    fixed = build_dataset("random", tokenizer, 5, 0, random_input_len=33, random_output_len=7, random_range_ratio=1.0)
    assert [(len(r.input_ids), r.output_len) for r in fixed] == [(33, 7)] * 5
    special = set(tokenizer.all_special_ids)
    assert not any(i in special for r in reqs for i in r.input_ids)


def test_sharegpt_like_lengths(tokenizer):
    reqs = build_dataset("sharegpt-like", tokenizer, 400, 1)
    assert len(reqs) == 400
    assert all(4 <= r.prompt_len <= 2048 and 4 <= r.output_len <= 1024 for r in reqs)
    assert all(len(r.input_ids) == r.prompt_len for r in reqs)
    mean_in = sum(r.prompt_len for r in reqs) / 400
    mean_out = sum(r.output_len for r in reqs) / 400
    assert 150 < mean_in < 250 and 130 < mean_out < 210
    again = build_dataset("sharegpt-like", tokenizer, 400, 1)
    assert [r.input_ids for r in again] == [r.input_ids for r in reqs]


def test_generated_shared_prefix(tokenizer):
    reqs = build_dataset("generated-shared-prefix", tokenizer, 0, 3, **GSP)
    assert len(reqs) == 6
    assert all(len(r.input_ids) == 30 and r.output_len == 5 for r in reqs)
    prefixes = {tuple(r.input_ids[:24]) for r in reqs}
    assert len(prefixes) == 2
    assert len({tuple(r.input_ids) for r in reqs}) == 6
    grouped = build_dataset("generated-shared-prefix", tokenizer, 0, 3, gsp_order="grouped", **GSP)
    assert [r.input_ids for r in grouped] != [r.input_ids for r in reqs]  # shuffled
    assert sorted(map(tuple, (r.input_ids for r in grouped))) == sorted(map(tuple, (r.input_ids for r in reqs)))
    heads = [tuple(r.input_ids[:24]) for r in grouped]
    assert heads == [heads[0]] * 3 + [heads[3]] * 3 and heads[0] != heads[3]
    rounds = build_dataset("generated-shared-prefix", tokenizer, 0, 3, gsp_order="rounds", **GSP)
    assert sorted(map(tuple, (r.input_ids for r in rounds))) == sorted(map(tuple, (r.input_ids for r in reqs)))
    for j in range(0, 6, 2):  # each round holds one prompt of each group
        assert {tuple(r.input_ids[:24]) for r in rounds[j : j + 2]} == prefixes


def test_word_prompts_without_tokenizer():
    src = PromptSource(None, random.Random(0))
    req = src.request(src.ids(12), 3)
    assert req.input_ids is None and len(req.prompt.split()) == 12


def test_timer_splits_multi_token_chunks():
    res = RequestResult()
    t = StreamTimer(res, 0.0)
    t.add(0, 0.05)
    t.add(1, 0.1)
    t.add(2, 0.3)
    assert res.ttft == pytest.approx(0.1)
    assert res.itl == pytest.approx([0.1, 0.1])
    res.ok, res.output_len, res.latency, res.prompt_len, res.cached_tokens = True, 3, 0.3, 10, 4
    rep = summarize([res, RequestResult(error="x")], 1.0)
    assert rep["completed"] == 1 and rep["failed"] == 1 and rep["cache_hit_rate"] == pytest.approx(0.4)
    assert rep["tpot_ms"]["mean"] == pytest.approx(100.0)


@pytest.mark.slow
def test_end_to_end_native(tmp_path, shared_server):
    from radixlm.bench.serving import main

    out_file = tmp_path / "bench.json"
    port = shared_server.base_url.rsplit(":", 1)[1]
    argv = ["--backend", "radixlm", "--port", port, "--tokenizer", "default", "--dataset-name",
            "generated-shared-prefix", "--gsp-num-groups", "2", "--gsp-prompts-per-group", "3",
            "--gsp-system-prompt-len", "48", "--gsp-question-len", "8", "--gsp-output-len", "6",
            "--max-concurrency", "2", "--flush-cache", "--disable-tqdm", "--output-file", str(out_file)]
    rep = main(argv)
    assert rep["completed"] == 6 and rep["failed"] == 0
    assert rep["total_input_tokens"] == 6 * 56 and rep["total_output_tokens"] == 6 * 6
    assert rep["output_throughput"] > 0 and rep["request_throughput"] > 0
    assert 0 < rep["ttft_ms"]["mean"] <= rep["e2e_latency_ms"]["mean"]
    assert rep["itl_ms"]["mean"] > 0 and rep["tpot_ms"]["mean"] > 0
    assert rep["cache_hit_rate"] is not None and rep["cache_hit_rate"] > 0
    saved = json.loads(out_file.read_text())
    assert saved["completed"] == 6 and saved["config"]["dataset_name"] == "generated-shared-prefix"


def test_sse_lines_split_only_on_newlines():
    """Generated text may hold U+2028 or U+0085 unescaped inside a JSON string: they are not SSE line ends."""
    import asyncio

    import httpx

    from radixlm.bench.serving import sse_data

    events = [{"text": "a\u2028b\x85c"}, {"text": "\u2029", "n": 2}]
    body = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\r\n\r\n" for e in events) + "data: [DONE]\n\n"
    raw = body.encode()

    class Chunks(httpx.AsyncByteStream):
        async def __aiter__(self):
            for i in range(0, len(raw), 7):  # events cut at arbitrary byte boundaries
                yield raw[i : i + 7]

    async def collect():
        return [e async for e in sse_data(httpx.Response(200, stream=Chunks()))]

    assert asyncio.run(collect()) == events


def test_lora_names_spread_requests_round_robin():
    from radixlm.bench.datasets import BenchRequest
    from radixlm.bench.serving import RunConfig, build_payload

    req = BenchRequest("p", [1, 2], 2, 3)
    native = RunConfig("radixlm", "http://x", "base", 1.0, None, True, 0, lora_names=("a", "b"))
    assert [build_payload(native, req, i).get("lora_path") for i in range(3)] == ["a", "b", "a"]
    assert "lora_path" not in build_payload(RunConfig("radixlm", "http://x", "base", 1.0, None, True, 0), req)
    openai = RunConfig("openai", "http://x", "base", 1.0, None, True, 0, lora_names=("a", "b"))
    assert build_payload(openai, req, 1)["model"] == "b"


def test_merge_runs_matches_one_process():
    from radixlm.bench.metrics import ClientRun, merge_runs

    def res(start, ttft, latency, n):
        return RequestResult(ok=True, prompt_len=4, output_len=n, ttft=ttft, latency=latency, start=start,
                             itl=[(latency - ttft) / (n - 1)] * (n - 1))

    a, b, c = res(10.0, 0.1, 1.0, 5), res(10.2, 0.2, 2.0, 9), res(10.5, 0.1, 0.5, 3)
    one = summarize([a, b, c], 2.3)
    results, duration = merge_runs([ClientRun([a, c], 10.0, 11.0, 0.1), ClientRun([b], 10.0, 12.3, 0.2)])
    assert duration == pytest.approx(2.3)
    merged = summarize(results, duration)
    for key in ("completed", "total_output_tokens", "output_throughput", "request_throughput"):
        assert merged[key] == pytest.approx(one[key])
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_latency_ms"):
        assert merged[key] == pytest.approx(one[key])
    with pytest.raises(ValueError):
        merge_runs([])


def test_client_bound_flag():
    from radixlm.bench.metrics import ClientRun, client_report, format_report

    light = client_report([ClientRun([], 0.0, 2.0, 0.5), ClientRun([], 0.0, 2.0, 1.5)], 1000)
    assert light["cpu_utilization"] == pytest.approx([0.25, 0.75]) and not light["client_bound"]
    assert light["cpu_us_per_output_token"] == pytest.approx(2000.0)
    heavy = client_report([ClientRun([], 0.0, 2.0, 0.5), ClientRun([], 0.0, 2.0, 1.7)], 1000)
    assert heavy["client_bound"]
    rep = summarize([], 1.0) | {"client": heavy}
    assert "Client bound" in format_report(rep, "t") and "YES" in format_report(rep, "t")


def test_native_completion_tokens_without_decoding():
    from radixlm.bench.serving import native_completion_tokens

    chunk = {"text": 'say "completion_tokens": 9', "output_ids": [1, 2], "meta_info": {"completion_tokens": 2}}
    assert native_completion_tokens(json.dumps(chunk).encode()) == 2
    assert native_completion_tokens(b'{"text": "x", "output_ids": [1]}') is None


@pytest.fixture(scope="module")
def fake_server():
    """The fake SSE server (radixlm.bench.fake_sse) on a thread of this process."""
    import asyncio
    import threading

    from radixlm.bench import procs
    from radixlm.bench.fake_sse import FakeServer

    port = procs.free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    tasks = []

    async def run():
        started = asyncio.Event()
        tasks.append(asyncio.create_task(FakeServer(0.001).serve("127.0.0.1", port, started)))
        await started.wait()
        ready.set()
        try:
            await tasks[0]
        except asyncio.CancelledError:
            pass

    thread = threading.Thread(target=lambda: loop.run_until_complete(run()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield port
    loop.call_soon_threadsafe(tasks[0].cancel)
    thread.join(10)
    loop.close()


@pytest.mark.parametrize("backend,client,procs", [("radixlm", "aiohttp", 1), ("openai-chat", "httpx", 1),
                                                  ("radixlm", "aiohttp", 2)])
def test_end_to_end_fake_server(fake_server, tmp_path, backend, client, procs):
    from radixlm.bench.serving import main

    out_file = tmp_path / "bench.json"
    rep = main(["--backend", backend, "--port", str(fake_server), "--dataset-name", "random", "--num-prompts", "8",
                "--random-input-len", "8", "--random-output-len", "20", "--random-range-ratio", "1",
                "--max-concurrency", "4", "--disable-tqdm", "--http-client", client,
                "--num-client-processes", str(procs), "--output-file", str(out_file)])
    assert rep["completed"] == 8 and rep["failed"] == 0 and rep["total_output_tokens"] == 160
    assert rep["total_input_tokens"] == 8 * 32  # the fake server's prompt_tokens, read from the last chunk
    assert rep["ttft_ms"]["mean"] > 0 and rep["itl_ms"]["mean"] > 0 and rep["output_throughput"] > 0
    assert rep["client"]["processes"] == procs and rep["client"]["cpu_s"] > 0
    assert json.loads(out_file.read_text())["client_bound"] == rep["client_bound"]


def test_stream_reader_native_counts_errors_and_done():
    from radixlm.bench.sse import StreamReader

    def event(k):
        meta = {"prompt_tokens": 7, "completion_tokens": k, "cached_tokens": 3}
        return b"data: " + json.dumps({"text": "x" * k, "output_ids": [5] * k, "meta_info": meta}).encode() + b"\n\n"

    res = RequestResult()
    reader = StreamReader(True, False, res, 0.0)
    raw = event(1) + event(3) + b"data: [DONE]\n\n" + event(9)
    for i in range(0, len(raw), 11):
        reader.feed(raw[i : i + 11])
    reader.close(0.0)
    assert res.ok and res.output_len == 3 and (res.prompt_len, res.cached_tokens) == (7, 3) and len(res.itl) == 2
    bad = RequestResult()
    reader = StreamReader(True, False, bad, 0.0)
    reader.feed(event(1) + b'data: {"error": {"message": "boom"}}\n\n' + event(2))
    reader.close(0.0)
    assert not bad.ok and "boom" in bad.error and bad.output_len == 1


def test_num_client_processes_bounds():
    from radixlm.bench.datasets import BenchRequest
    from radixlm.bench.serving import RunConfig, run_multi

    cfg = RunConfig("radixlm", "http://127.0.0.1:9", "m", float("inf"), 2, True, 0)
    reqs = [BenchRequest("p", [1], 1, 2)] * 4
    with pytest.raises(ValueError, match=">= 1"):
        run_multi(cfg, reqs, 0)
    with pytest.raises(ValueError, match="exceeds"):
        run_multi(cfg, reqs, 3)  # more processes than --max-concurrency
