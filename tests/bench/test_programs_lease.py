"""What the single-GPU lease (benchmarks/lease/single_gpu_lease.sh) relies on in the LM-programs benchmark: the JSON is
written after every variant (a call killed at its time limit keeps what it measured), and `python -m
radixlm.bench.programs --merge` joins the variants of calls into one table with all_off as the baseline column."""
from __future__ import annotations

import json

import pytest

from radixlm.bench.programs import __main__ as cli


def result(pps: float) -> dict:
    return {"programs": 2, "completed": 2, "failed": 0, "duration_s": 2 / pps, "programs_per_s": pps,
            "mean_latency_s": 1 / pps, "output_tokens": 10, "output_tokens_per_s": 10.0, "requests": 2,
            "prompt_tokens": 100, "cache_hit_rate": 0.5, "optimal_hit_rate": 0.5, "achieved_over_optimal": 1.0,
            "accuracy": None}


def test_json_written_after_each_variant_and_merged(tmp_path, monkeypatch):
    calls = []

    def fake_run_variant(workloads, spec, variant, opt, log=print):
        calls.append(variant.name)
        if variant.name == "no_frontend_hint":
            raise KeyboardInterrupt  # stands for the timeout's signal in the middle of the second variant
        return {w.name: result(4.0) for w in workloads}

    monkeypatch.setattr(cli, "run_variant", fake_run_variant)
    p1 = tmp_path / "p1.json"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--base-url", "http://127.0.0.1:9", "--no-optimal", "--workloads", "mmlu", "--ablations",
                  "--variants", "full,no_frontend_hint", "--num-programs", "2", "--output-file", str(p1)])
    assert calls == ["full", "no_frontend_hint"]
    kept = json.loads(p1.read_text())
    assert list(kept["variants"]) == ["full"] and kept["variants"]["full"]["mmlu"]["programs_per_s"] == 4.0
    # a second call's variants (all_off the baseline), merged in the paper's order
    monkeypatch.setattr(cli, "run_variant", lambda w, s, v, o, log=print: {x.name: result(1.0) for x in w})
    p2 = tmp_path / "p2.json"
    cli.main(["--base-url", "http://127.0.0.1:9", "--no-optimal", "--workloads", "mmlu", "--ablations",
              "--variants", "no_frontend_parallelism", "--num-programs", "2", "--output-file", str(p2)])
    # (no_frontend_parallelism needs no server of its own, so it runs against --base-url; rename it all_off's)
    second = json.loads(p2.read_text())
    second["variants"] = {"all_off": second["variants"]["no_frontend_parallelism"]}
    p2.write_text(json.dumps(second))
    merged = cli.main(["--merge", str(p2), str(p1), str(tmp_path / "missing.json"), "--output-file",
                       str(tmp_path / "m.json"), "--note", "two calls"])
    assert list(merged["variants"]) == ["full", "all_off"]
    md = (tmp_path / "m.md").read_text()
    assert "| mmlu | 4.00 (4.00x) | 1.00 |" in md and "two calls" in md
    other = json.loads(p1.read_text())
    other["config"]["scale"] = 0.5
    (tmp_path / "o.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="scale"):
        cli.main(["--merge", str(p1), str(tmp_path / "o.json"), "--output-file", str(tmp_path / "x.json")])
