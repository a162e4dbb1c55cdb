"""radixlm.bench.programs: the optimal hit rate on hand-made request sets, every workload's programs on a scripted
backend (parallel and sequential), the recorder, the report, the CLI switches, and one run against a real server."""
from __future__ import annotations

import json
import random
import time

import httpx
import pytest

from radixlm.bench.programs import __main__ as cli
from radixlm.bench.programs import report
from radixlm.bench.programs.optimal import Request, optimal_hit_rate, simulate_dfs
from radixlm.bench.programs import runner
from radixlm.bench.programs.record import Recorder, RecordingTransport, Sent, parse_exchange, token_requests
from radixlm.bench.programs.runner import VARIANTS, BackendSpec, RunOptions, Variant, run_workload
from radixlm.bench.programs.workloads import WORKLOADS
from tests.lang.fake_backend import FakeBackend


# ---- the optimal hit rate
def rate(reqs):
    return optimal_hit_rate([Request(*r) if isinstance(r, tuple) else Request(r) for r in reqs])


def test_optimal_single_and_disjoint_requests_hit_nothing():
    assert rate([[1, 2, 3]])["optimal_hit_rate"] == 0.0
    assert rate([[1, 2], [3, 4], [5]])["optimal_hit_rate"] == 0.0
    assert rate([])["optimal_hit_rate"] == 0.0


def test_optimal_shared_prefixes_are_computed_once():
    r = rate([[1, 2, 3], [1, 2, 3]])
    assert (r["total_prompt_tokens"], r["unique_prompt_tokens"]) == (6, 3) and r["optimal_hit_rate"] == 0.5
    assert rate([[1, 2, 3, 4], [1, 2, 5]])["optimal_hit_rate"] == pytest.approx(2 / 7)
    # a few-shot shape: a 10-token prefix shared by 4 questions of 2 tokens
    r = rate([list(range(10)) + [100 + q, 200 + q] for q in range(4)])
    assert r["optimal_hit_rate"] == pytest.approx(1 - (10 + 8) / 48)
    # a prompt that is a prefix of another one
    assert rate([[1, 2], [1, 2, 3, 4]])["optimal_hit_rate"] == pytest.approx(2 / 6)


def test_optimal_takes_a_joint_tokenization_of_text_outputs():
    # prompt [1, 2, 3]; prompt + output text tokenized jointly: [1, 2, 9, 4] (3 merged with the output into 9)
    r = optimal_hit_rate([Request([1, 2, 3], full=[1, 2, 9, 4], gen_from=2), Request([1, 2, 9, 4, 5])])
    assert r["must_compute_tokens"] == 4 and r["optimal_hit_rate"] == pytest.approx(1 - 4 / 8)


def test_optimal_counts_decoded_tokens_as_computed():
    # turn 2 carries turn 1's answer (3, 4): decoding computed it already
    r = rate([([1, 2], [3, 4]), ([1, 2, 3, 4, 5], [6])])
    assert r["optimal_hit_rate"] == pytest.approx(1 - 3 / 7)
    assert r["optimal_hit_rate_prompts_only"] == pytest.approx(1 - 5 / 7)


def test_optimal_equals_a_dfs_simulation_on_random_trees():
    rng = random.Random(0)
    for _ in range(50):
        prefixes = [[rng.randrange(5) for _ in range(rng.randint(0, 6))] for _ in range(rng.randint(1, 4))]
        reqs = [Request(rng.choice(prefixes) + [rng.randrange(5) for _ in range(rng.randint(1, 5))])
                for _ in range(rng.randint(1, 12))]
        assert optimal_hit_rate(reqs)["optimal_hit_rate"] == pytest.approx(simulate_dfs(reqs))


# ---- the workloads on a scripted backend
def test_workload_data_is_seeded_and_shaped():
    for w in WORKLOADS.values():
        a, la = w.instances(3, seed=5, scale=0.2)
        b, lb = w.instances(3, seed=5, scale=0.2)
        c, _ = w.instances(3, seed=6, scale=0.2)
        assert a == b and la == lb and a != c and len(a) == 3, w.name
        assert all(set(it) <= set(w.program.arg_names) for it in a), w.name
    mmlu, _ = WORKLOADS["mmlu"].instances(40, 0, 1.0)
    assert len({m["examples"] for m in mmlu}) == 3
    assert mmlu[0]["examples"] == mmlu[3]["examples"] != mmlu[1]["examples"]
    assert mmlu[0]["examples"].count("Answer:") == 5
    hs, labels = WORKLOADS["hellaswag"].instances(4, 0, 1.0)
    assert len({h["few_shot"] for h in hs}) == 1 and hs[0]["few_shot"].count("\n\n") == 20
    assert all(len(h["choices"]) == 4 for h in hs) and all(0 <= x < 4 for x in labels)
    chat, _ = WORKLOADS["chat_long"].instances(2, 0, 1.0)
    assert all(len(c["questions"]) == 4 and all(256 <= n <= 512 for n in c["output_lens"]) for c in chat)
    assert all(256 <= len(q.split()) <= 512 for q in chat[0]["questions"])
    agents, _ = WORKLOADS["generative_agents"].instances(8, 0, 1.0)
    assert len({a["agent"] for a in agents}) == 2 and agents[0]["agent"].count("\n- ") == 12
    short, _ = WORKLOADS["chat_short"].instances(2, 0, 1.0)
    assert all(4 <= n <= 8 for c in short for n in c["output_lens"])


@pytest.mark.parametrize("parallel", [True, False])
def test_every_workload_runs_on_a_scripted_backend(parallel):
    be = FakeBackend(delay=0.002)
    expected_gens = {"mmlu": 1, "react": 8, "tree_of_thought": 9, "skeleton_of_thought": 6, "llm_judge": 6,
                     "json_decode": 1, "chat_short": 4, "chat_long": 4, "rag": 2, "hellaswag": 0,
                     "generative_agents": 2, "llava_bench": 3}
    for w in WORKLOADS.values():
        be.calls.clear()
        be.max_active = 0
        r = run_workload(w, be, Recorder(), Variant("v", parallel=parallel), RunOptions(3, 0, 0.1, num_threads=3))
        assert r["completed"] == 3 and r["failed"] == 0 and "error" not in r, (w.name, r)
        assert r["programs_per_s"] > 0 and r["mean_latency_s"] > 0
        gens = sum(k == "gen" for k, _ in be.calls)
        assert gens == 3 * expected_gens[w.name], w.name
        if "select" in w.needs:
            assert any(k == "select" for k, _ in be.calls)
        if w.label_key:
            assert r["accuracy"] is not None
        if not parallel:
            assert be.max_active == 1, w.name


def test_fork_hint_switch_controls_the_shared_prefix_prefill():
    w = WORKLOADS["skeleton_of_thought"]
    commits = {}
    for hints in (True, False):
        be = FakeBackend()
        run_workload(w, be, Recorder(), Variant("v", hints=hints), RunOptions(2, 0, 0.1, num_threads=2))
        commits[hints] = sum(k == "commit" for k, _ in be.calls)
    assert commits == {True: 2, False: 0}


# ---- recording
def test_recorder_parses_native_and_openai_exchanges():
    native = parse_exchange("/generate", {"text": ["ab", "abc"]}, [
        {"text": "x", "output_ids": [7], "meta_info": {"prompt_tokens": 2, "cached_tokens": 1, "completion_tokens": 1}},
        {"text": "y", "output_ids": [8],
         "meta_info": {"prompt_tokens": 3, "cached_tokens": 2, "completion_tokens": 1}}])
    assert [(s.prompt_text, s.output_ids, s.cached_tokens) for s in native] == [("ab", [7], 1), ("abc", [8], 2)]
    ids = parse_exchange("/generate", {"input_ids": [1, 2]}, {"text": "", "meta_info": {"prompt_tokens": 2}})
    assert ids[0].prompt_ids == [1, 2]
    oa = parse_exchange("/v1/completions", {"prompt": ["p", "q"]}, {
        "choices": [{"index": 1, "text": "Q"}, {"index": 0, "text": "P"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}}})
    assert [(s.prompt_text, s.output_text, s.prompt_tokens) for s in oa] == [("p", "P", 4), ("q", "Q", None)]
    rec = Recorder()
    rec.add(native + oa)
    assert rec.summary()["cache_hit_rate"] == pytest.approx((1 + 2 + 1) / (2 + 3 + 4))

    class Tok:
        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

    reqs, mismatched = token_requests(native, Tok())
    assert reqs[1].prompt == [97, 98, 99] and reqs[1].output == [8] and mismatched == 0
    reqs, mismatched = token_requests(oa, Tok())  # output text: tokenized together with its prompt
    assert reqs[0].sequence() == ([ord("p"), ord("P")], 1) and mismatched == 1


def test_image_prompts_get_a_run_per_image_as_long_as_the_servers_count():
    class Tok:
        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

    def sent(text, image, prompt_tokens):
        body = {"text": text, "image_data": [image]}
        return parse_exchange("/generate", body, {"output_ids": [1], "meta_info": {"prompt_tokens": prompt_tokens}})[0]

    # "<i>" stands for an image that the server expands to 3 + 4 tokens; the questions after it differ
    a, b, c = sent("s<i>q1", "A", 10), sent("s<i>q2", "A", 10), sent("s<i>q1", "B", 10)
    assert a.images == b.images != c.images and len(a.images) == 1
    reqs, mismatched = token_requests([a, b, c], Tok(), image_token="<i>")
    assert mismatched == 0 and all(len(r.prompt) == 10 for r in reqs)
    head = [ord(x) for x in "s<i>"]
    assert reqs[0].prompt[:4] == head and len(set(reqs[0].prompt[4:8])) == 1 and reqs[0].prompt[4] < 0
    assert reqs[0].prompt[:8] == reqs[1].prompt[:8] and reqs[0].prompt[4] != reqs[2].prompt[4]
    # the two questions of image A share its 8 tokens and "q"; B shares only "s<i>" with them
    assert optimal_hit_rate(reqs)["optimal_hit_rate"] == pytest.approx((9 + 4) / 30)
    assert token_requests([a], Tok())[0][0].prompt == [ord(x) for x in "s<i>q1"]  # no image token: text only


def test_image_workloads_need_a_vision_model_on_the_runtime_backend():
    w = WORKLOADS["llava_bench"]
    runtime, openai = BackendSpec("runtime", "http://x"), BackendSpec("openai", "http://x/v1")
    assert runner.unsupported(w, runtime, {"has_image_understanding": True}) is None
    assert "images" in runner.unsupported(w, runtime, {"has_image_understanding": False})
    assert "images" in runner.unsupported(w, openai, None)
    assert runner.unsupported(WORKLOADS["mmlu"], runtime, {"has_image_understanding": False}) is None
    items, _ = w.instances(2, 0, 0.05)
    assert all(it["image"][:8] == b"\x89PNG\r\n\x1a\n" and len(it["questions"]) == 3 for it in items)


def test_recording_transport_passes_responses_through():
    def handler(request):
        if request.url.path != "/generate":
            return httpx.Response(200, text="ok")
        body = json.loads(request.content)
        return httpx.Response(200, json={"text": body["text"] + "!", "output_ids": [1],
                                         "meta_info": {"prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 1}})

    rec = Recorder()
    client = httpx.Client(base_url="http://x", transport=RecordingTransport(rec, httpx.MockTransport(handler)))
    assert client.post("/generate", json={"text": "hi"}).json()["text"] == "hi!"
    assert client.post("/flush_cache").status_code == 200
    assert len(rec.sent) == 1 and rec.sent[0].prompt_text == "hi"


# ---- report and CLI
def fake_result(pps, hit=0.5, opt=0.6):
    return {"programs": 2, "completed": 2, "failed": 0, "duration_s": 1.0, "programs_per_s": pps,
            "mean_latency_s": 1 / pps, "output_tokens": 10, "output_tokens_per_s": 10.0, "requests": 4,
            "prompt_tokens": 100, "cache_hit_rate": hit, "optimal_hit_rate": opt, "achieved_over_optimal": hit / opt,
            "accuracy": None}


def test_report_tables_and_files(tmp_path):
    out = {"config": {"command": "python -m radixlm.bench.programs --ablations", "backend": "runtime",
                      "model": "default", "num_programs": 2, "seed": 0, "scale": 0.1, "num_threads": 4},
           "variants": {"full": {"mmlu": fake_result(4.0), "json_decode": {"skipped": "no regex"}},
                        "all_off": {"mmlu": fake_result(1.0, 0.0), "json_decode": {"skipped": "no regex"}}}}
    md = report.markdown(out)
    assert "| mmlu | 4.00 (4.00x) | 1.00 |" in md and "skipped" in md and "83.3%" in md
    written = report.write(out, str(tmp_path / "r.json"))
    assert json.loads((tmp_path / "r.json").read_text()) == out
    assert (tmp_path / "r.md").read_text() == md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "png" not in written
    else:
        assert "png" in written


def test_cli_switches_map_to_variants():
    v = cli.single_variant(cli.parse_args([]))
    assert (v.name, v.server_args, v.parallel, v.hints) == ("full", (), True, True)
    v = cli.single_variant(cli.parse_args(["--disable-radix-cache", "--schedule-policy", "random",
                                           "--no-frontend-parallelism", "--no-fork-hint"]))
    assert v.server_args == ("--disable-radix-cache", "--schedule-policy", "random")
    assert not v.parallel and not v.hints
    v = cli.single_variant(cli.parse_args(["--all-off"]))
    assert v.name == "all_off" and "--disable-radix-cache" in v.server_args and not v.parallel and not v.hints
    assert [x.name for x in cli.chosen_variants(cli.parse_args(["--ablations"]))] == [x.name for x in VARIANTS]
    assert [x.name for x in cli.chosen_variants(cli.parse_args(["--ablations", "--variants", "all_off,full"]))] == \
        ["full", "all_off"]


def test_num_programs_per_workload_is_parsed_and_validated():
    assert cli.parse_counts("") == {}
    assert cli.parse_counts("mmlu=128, hellaswag=64") == {"mmlu": 128, "hellaswag": 64}
    for bad, why in (("nosuch=3", "unknown workload 'nosuch'"), ("mmlu=0", "must be positive"),
                     ("mmlu=-2", "must be positive"), ("mmlu", "WORKLOAD=COUNT"), ("mmlu=x", "WORKLOAD=COUNT"),
                     ("mmlu=2,mmlu=3", "given twice")):
        with pytest.raises(SystemExit, match=why):
            cli.parse_counts(bad)
    with pytest.raises(SystemExit, match="unknown workload"):  # checked before anything runs
        cli.main(["--base-url", "http://127.0.0.1:9", "--no-optimal", "--num-programs-per-workload", "mmmlu=8"])


class CountingSpec(BackendSpec):
    """run_variant's backend: a FakeBackend that records each gen as a request; the first `slow` gens (the
    warm-up's) take 0.3 s each."""

    def __init__(self, slow=0):
        super().__init__("runtime", "http://unused")
        self.slow, self.flushes, self.backend = slow, 0, None

    def make(self, recorder):
        spec = self

        class Backend(FakeBackend):
            def generate(self, s, sampling_params):
                out = super().generate(s, sampling_params)
                if self.counter <= spec.slow:
                    time.sleep(0.3)
                recorder.add([Sent(prompt_text=s.text_, prompt_tokens=10, cached_tokens=0, completion_tokens=1)])
                return out

        self.backend = Backend()
        return self.backend

    def flush(self, backend):
        self.flushes += 1
        return True


def test_run_variant_warms_each_workload_up_unmeasured_with_its_own_counts():
    w = [WORKLOADS["mmlu"], WORKLOADS["rag"]]
    opt = RunOptions(3, 0, 0.1, num_threads=8, counts={"mmlu": 6}, warm_up=4)
    spec = CountingSpec(slow=4)  # mmlu's warm-up: 4 programs, one gen each
    out = runner.run_variant(w, spec, Variant("full"), opt, log=lambda m: None)
    assert (out["mmlu"]["programs"], out["rag"]["programs"]) == (6, 3) and spec.flushes == 2
    assert out["mmlu"]["warm_up"]["programs"] == 4 and out["rag"]["warm_up"]["programs"] == 3
    assert out["mmlu"]["warm_up"]["duration_s"] >= 0.3 > out["mmlu"]["duration_s"]
    assert out["mmlu"]["requests"] == 6 and out["rag"]["requests"] == 3 * 2  # the warm-up's are not counted
    prompts = [p for k, p in spec.backend.calls if k == "gen"]
    assert len(prompts) == (4 + 6) + (3 + 3) * 2
    assert not set(prompts[:4]) & set(prompts[4:10])  # the warm-up ran other programs than the measured ones
    spec = CountingSpec()
    runner.run_variant(w, spec, Variant("all_off", parallel=False), RunOptions(2, 0, 0.1, warm_up=0),
                       log=lambda m: None)
    assert len([k for k, _ in spec.backend.calls if k == "gen"]) == 2 + 2 * 2 and spec.backend.max_active == 1


def test_cli_passes_counts_and_warm_up_and_records_them(tmp_path, monkeypatch):
    seen = []

    def fake_run_variant(workloads, spec, variant, opt, log=print):
        seen.append({w.name: opt.programs_for(w.name) for w in workloads} | {"warm_up": opt.warm_up})
        return {w.name: dict(fake_result(2.0), programs=opt.programs_for(w.name)) for w in workloads}

    monkeypatch.setattr(cli, "run_variant", fake_run_variant)
    out = cli.main(["--base-url", "http://127.0.0.1:9", "--no-optimal", "--workloads", "mmlu,hellaswag,rag",
                    "--ablations", "--variants", "full,no_frontend_hint", "--num-programs", "5",
                    "--num-programs-per-workload", "mmlu=128,hellaswag=64", "--output-file", str(tmp_path / "r.json")])
    assert seen == [{"mmlu": 128, "hellaswag": 64, "rag": 5, "warm_up": 4}] * 2
    cfg = json.loads((tmp_path / "r.json").read_text())["config"]
    assert cfg == out["config"] and cfg["num_programs_per_workload"] == {"mmlu": 128, "hellaswag": 64, "rag": 5}
    assert cfg["warm_up"]["max_programs"] == 4 and cfg["warm_up"]["measured"] is False
    md = (tmp_path / "r.md").read_text()
    assert "5 programs per workload (mmlu 128, hellaswag 64)" in md and "Warm-up: " in md
    cli.main(["--base-url", "http://127.0.0.1:9", "--no-optimal", "--workloads", "rag", "--warm-up-programs", "0"])
    assert seen[-1]["warm_up"] == 0


# ---- --repeat: medians over identical runs
def test_combine_runs_takes_per_figure_medians_and_keeps_every_run():
    runs = [dict(fake_result(p), duration_s=2 / p, cache_hit_rate=h, cache_flushed=True, http_errors=e)
            for p, h, e in ((4.0, 0.2, 0), (1.0, 0.6, 2), (2.0, 0.4, 0))]
    runs[1].update(failed=1, completed=1, error="RuntimeError: x")
    r = runner.combine_runs(runs)
    assert r["programs_per_s"] == 2.0 and r["duration_s"] == 1.0 and r["mean_latency_s"] == 0.5
    assert r["cache_hit_rate"] == 0.4 and r["achieved_over_optimal"] == pytest.approx(0.5 / 0.6)
    assert (r["completed"], r["failed"], r["http_errors"], r["error"]) == (1, 1, 2, "RuntimeError: x")
    assert [x["programs_per_s"] for x in r["runs"]] == [4.0, 1.0, 2.0]
    assert [x["duration_s"] for x in r["runs"]] == [0.5, 2.0, 1.0]
    assert r["programs_per_s_spread"] == 4.0 and r["accuracy"] is None
    even = runner.combine_runs([dict(fake_result(p), cache_flushed=True) for p in (1.0, 3.0)])
    assert even["programs_per_s"] == 2.0 and even["programs_per_s_spread"] == 3.0


def test_run_variant_repeats_identical_flushed_runs():
    w = [WORKLOADS["mmlu"]]
    spec = CountingSpec()
    out = runner.run_variant(w, spec, Variant("full"), RunOptions(3, 0, 0.1, num_threads=1, repeat=3),
                             log=lambda m: None)
    r = out["mmlu"]
    assert spec.flushes == 3 and len(r["runs"]) == 3 and r["requests"] == 3 and r["completed"] == 3
    prompts = [p for k, p in spec.backend.calls if k == "gen"]
    assert len(prompts) == 9 and prompts[:3] == prompts[3:6] == prompts[6:]
    assert r["programs_per_s"] == sorted(x["programs_per_s"] for x in r["runs"])[1]
    single = runner.run_variant(w, CountingSpec(), Variant("full"), RunOptions(3, 0, 0.1), log=lambda m: None)
    assert "runs" not in single["mmlu"] and "programs_per_s_spread" not in single["mmlu"]


def test_repeat_max_seconds_repeats_only_short_first_runs(monkeypatch):
    durations = {"mmlu": [0.5, 0.25, 1.0], "rag": [5.0], "react": [1.0]}
    calls = []

    def fake_run_workload(w, backend, recorder, variant, opt, flush=None):
        d = durations[w.name][sum(c == w.name for c in calls)]
        calls.append(w.name)
        return dict(fake_result(2 / d), duration_s=d, cache_flushed=True)

    monkeypatch.setattr(runner, "run_workload", fake_run_workload)
    opt = RunOptions(2, 0, 0.1, repeat=3, repeat_max_seconds=1.0)
    out = runner.run_variant([WORKLOADS[n] for n in durations], CountingSpec(), Variant("full"), opt,
                             log=lambda m: None)
    assert calls == ["mmlu"] * 3 + ["rag", "react"]  # react's 1.0 s is not under 1.0 s
    assert out["mmlu"]["duration_s"] == 0.5 and out["mmlu"]["programs_per_s"] == 4.0
    assert out["mmlu"]["programs_per_s_spread"] == 4.0
    assert [x["duration_s"] for x in out["rag"]["runs"]] == [5.0] and out["rag"]["programs_per_s_spread"] == 1.0
    assert runner.repeats_for({"duration_s": 0.9}, opt) == 3 and runner.repeats_for({"duration_s": 1.0}, opt) == 1
    assert runner.repeats_for({"duration_s": 1e9}, RunOptions(repeat=2)) == 2


def test_cli_repeat_is_validated_passed_and_reported(tmp_path, monkeypatch):
    for bad, why in ((["--repeat", "0"], "--repeat must be 1 or more"),
                     (["--repeat", "2", "--repeat-max-seconds", "0"], "--repeat-max-seconds must be positive")):
        with pytest.raises(SystemExit, match=why):
            cli.main(["--base-url", "http://127.0.0.1:9", "--no-optimal", *bad])
    seen = []

    def fake_run_variant(workloads, spec, variant, opt, log=print):
        seen.append((opt.repeat, opt.repeat_max_seconds))
        runs = [dict(fake_result(p), cache_flushed=True) for p in (2.0, 3.0, 1.5)]
        return {w.name: runner.combine_runs(runs) for w in workloads}

    monkeypatch.setattr(cli, "run_variant", fake_run_variant)
    out = cli.main(["--base-url", "http://127.0.0.1:9", "--no-optimal", "--workloads", "mmlu", "--repeat", "3",
                    "--repeat-max-seconds", "5", "--output-file", str(tmp_path / "r.json")])
    assert seen == [(3, 5.0)]
    rep = json.loads((tmp_path / "r.json").read_text())["config"]["repeat"]
    assert rep["runs"] == 3 and rep["max_seconds"] == 5.0 and rep["stat"] == "median" and "under 5 s" in rep["rule"]
    assert out["variants"]["full"]["mmlu"]["programs_per_s"] == 2.0
    md = (tmp_path / "r.md").read_text()
    assert "Repeats: 3 measured runs where a variant's first run of a workload took under 5 s" in md
    assert "## Run-to-run spread" in md and "| mmlu | 2.00 (3 runs) |" in md
    assert cli.main(["--base-url", "http://127.0.0.1:9", "--no-optimal", "--workloads", "mmlu"])[
        "config"]["repeat"]["runs"] == 1
    assert seen[-1] == (1, None)


# ---- end to end against real SmolLM2 servers
@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # the session's default server (tests/conftest.py)


SMALL = ["--workloads", "mmlu,skeleton_of_thought", "--num-programs", "3", "--scale", "0.05", "--num-threads", "4"]


def check_ran(res: dict) -> None:
    for r in res.values():
        assert r["completed"] == 3 and r["failed"] == 0 and r["http_errors"] == 0, r
        assert r["tokenize_mismatches"] == 0 and r["output_tokens"] > 0 and r["cache_flushed"]


@pytest.mark.slow
def test_end_to_end_runtime_client_ablations(server, tmp_path):
    out = cli.main(["--base-url", server.base_url, *SMALL, "--ablations", "--variants",
                    "full,no_frontend_parallelism,no_frontend_hint,no_radix_cache",
                    "--output-file", str(tmp_path / "p.json")])
    runs = out["variants"]
    assert runs["no_radix_cache"]["mmlu"] == {"skipped": "needs --launch-server"}  # a server it did not start
    for v in ("full", "no_frontend_parallelism", "no_frontend_hint"):
        check_ran(runs[v])
        sot = runs[v]["skeleton_of_thought"]
        # the 3 branches share the question and the skeleton; mmlu's 3 questions share one subject's 5 shots
        assert 0 < sot["cache_hit_rate"] <= sot["optimal_hit_rate"] + 1e-9
        assert sot["achieved_over_optimal"] > 0.8 and runs[v]["mmlu"]["achieved_over_optimal"] > 0.8
    assert "no_frontend_hint" in (tmp_path / "p.md").read_text()
    assert json.loads((tmp_path / "p.json").read_text())["variants"].keys() == runs.keys()


@pytest.mark.slow
def test_end_to_end_openai_endpoint(server):
    out = cli.main(["--backend", "openai", "--base-url", server.base_url + "/v1", "--tokenizer", "default", *SMALL])
    res = out["variants"]["full"]
    check_ran(res)
    assert res["mmlu"]["achieved_over_optimal"] > 0.8


@pytest.mark.slow
def test_end_to_end_all_off_launches_its_own_server(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # mmlu alone: its questions share their shots, so a radix cache left on would show hits.
    out = cli.main(["--launch-server", *SMALL, "--workloads", "mmlu", "--all-off", "--server-timeout", "180",
                    "--server-args", "--max-total-tokens 4096 --random-seed 0"])
    res = out["variants"]["all_off"]
    check_ran(res)
    assert all(r["cache_hit_rate"] == 0 for r in res.values())  # --disable-radix-cache reached the server
