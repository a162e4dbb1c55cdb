"""benchmarks/peers/peer_side_by_side.py: medians over runs (metric by metric), cold and warm start-up apart, issue 20's
target verdicts on synthetic runs; and the CPU dry run (--tiny) end to end with every peer field written."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers import peer_side_by_side as pss  # noqa: E402

FIELDS = ("decode_step_ms", *pss.THROUGHPUT, "startup_s")


def _run(i: int, cache: str, d1: float, d256: float, share: float, sgpt: float | None, rand: float,
         start: float) -> dict:
    run = {"name": "cfg", "run_index": i, "kernel_cache": cache, "host": "h", "engine_args": {},
           "decode_step_ms": {"1": d1, "8": 7.0, "256": d256}, "random_1024_512_output_tok_s": rand,
           "shared_prefix_output_tok_s": share, "startup_s": start}
    if sgpt is not None:
        run["sharegpt_like_output_tok_s"] = sgpt
    return run


def _merge(tmp_path: Path, runs: list[dict]) -> dict:
    files = []
    for r in runs:
        f = tmp_path / f"peer_cfg_r{r['run_index']}.json"
        f.write_text(json.dumps(r))
        files.append(str(f))
    out = tmp_path / "merged.json"
    result = pss.merge(files, str(out))
    assert json.loads(out.read_text())["medians"] == json.loads(json.dumps(result["medians"]))
    return result


def test_medians_and_verdicts(tmp_path):
    # Run 3 was cut short before ShareGPT-like: that median is over runs 1 and 2.
    runs = [_run(3, "warm", 5.5, 15.2, 6400, None, 7000, 30.0),
            _run(1, "cold", 5.8, 14.0, 5000, 10000, 7200, 44.0),
            _run(2, "warm", 5.6, 14.9, 6330, 11000, 7150, 20.0)]
    res = _merge(tmp_path, runs)
    med = res["medians"]
    assert med["runs"] == 3 and [r["run_index"] for r in res["runs"]] == [1, 2, 3]
    assert med["decode_step_ms"] == {"1": 5.6, "8": 7.0, "256": 14.9}
    assert med["shared_prefix_output_tok_s"] == 6330 and med["random_1024_512_output_tok_s"] == 7150
    assert med["sharegpt_like_output_tok_s"] == 10500
    assert med["startup_s_cold"] == 44.0 and med["startup_s_warm"] == 25.0
    met = {t["metric"]: t["met"] for t in res["targets"]}
    assert met == {"shared_prefix_output_tok_s": True, "sharegpt_like_output_tok_s": True,
                   "random_1024_512_output_tok_s": True, "decode_step_ms.256": True, "decode_step_ms.1": True,
                   "startup_s_cold": True}
    assert "| decode step, batch 256 (ms) | 14.90 | 14.00 / 14.90 / 15.20 | 16.31 |" in res["table"]
    assert res["kernel_cache_by_run"] == {1: "cold", 2: "warm", 3: "warm"}


def test_missed_targets_and_missing_cold(tmp_path):
    runs = [_run(i, "warm", 5.7, 15.01, 6319, 10459, 7119, 46.0) for i in (1, 2, 3)]
    res = _merge(tmp_path, runs)
    met = {t["metric"]: t["met"] for t in res["targets"]}
    assert met == {"shared_prefix_output_tok_s": False, "sharegpt_like_output_tok_s": False,
                   "random_1024_512_output_tok_s": False, "decode_step_ms.256": False, "decode_step_ms.1": False,
                   "startup_s_cold": None}
    assert res["medians"]["startup_s_cold"] is None and res["medians"]["startup_s_warm"] == 46.0
    assert "| NO |" in res["table"]


def test_bounds_are_inclusive(tmp_path):
    res = _merge(tmp_path, [_run(1, "cold", 5.69, 15.0, 6320, 10460, 7120, 45.0)])
    assert all(t["met"] is True for t in res["targets"]), res["targets"]


def test_targets_match_issue_20():
    assert {m: (s, b) for m, s, b in pss.TARGETS} == {
        "shared_prefix_output_tok_s": ("min", 6320), "sharegpt_like_output_tok_s": ("min", 10460),
        "random_1024_512_output_tok_s": ("min", 7120), "decode_step_ms.256": ("max", 15.0),
        "decode_step_ms.1": ("max", 5.69), "startup_s_cold": ("max", 45.0)}
    for peer in pss.PEERS.values():
        assert set(peer["decode_step_ms"]) == {str(b) for b in pss.BATCHES} and peer["source"]


def test_another_gpu_model_gets_no_ratio_or_verdict(tmp_path):
    runs = [{**_run(i, "warm", 4.2, 12.7, 8000, 11300, 9000, 20.0), "gpu": "NVIDIA H200"} for i in (1, 2)]
    res = _merge(tmp_path, runs)
    assert res["comparable_to_peers"] is False and all(t["met"] is None for t in res["targets"])
    assert "| decode step, batch 256 (ms) | 12.70 | 12.70 / 12.70 | 16.31 | 16.49 | n/a | <= 15.0 | - |" in res["table"]
    assert "ran on NVIDIA H200" in res["table"] and "yes" not in res["table"]
    same = _merge(tmp_path, [{**r, "gpu": pss.PEERS_GPU} for r in runs])
    assert same["comparable_to_peers"] is True  # no cold run: start-up alone has no verdict
    assert [t["met"] for t in same["targets"]] == [True] * 5 + [None]
    with pytest.raises(SystemExit):
        _merge(tmp_path, [runs[0], {**runs[1], "gpu": pss.PEERS_GPU}])


def test_one_configuration_per_merge(tmp_path):
    other = {**_run(2, "warm", 5.6, 14.9, 6330, 11000, 7150, 20.0), "name": "other"}
    with pytest.raises(SystemExit):
        _merge(tmp_path, [_run(1, "cold", 5.8, 14.0, 5000, 10000, 7200, 44.0), other])


def test_tiny_dry_run(tmp_path):
    pss.main(["run", "1", "--tiny", "--out-dir", str(tmp_path), "--cache-dir", str(tmp_path / "cache")])
    run = json.loads((tmp_path / "peer_default_r1.json").read_text())
    assert all(run[f] for f in FIELDS) and run["kernel_cache"] == "cold"
    assert set(run["decode_step_ms"]) == {"1", "2", "4"} and run["raw"]["shared_prefix"]["hit_rate"] > 0
    assert run["raw"]["sharegpt_like"]["requests"] == 24 and run["raw"]["random_1024_512"]["output_tokens"] == 72
    merged = json.loads((tmp_path / "peer_default.json").read_text())
    assert merged["medians"]["shared_prefix_output_tok_s"] == run["shared_prefix_output_tok_s"]
    assert merged["medians"]["startup_s_cold"] == run["startup_s"] and len(merged["targets"]) == 6
