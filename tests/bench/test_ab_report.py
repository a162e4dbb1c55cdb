"""benchmarks/lib/ab_report.py: medians and ratios of an A/B of two trees (benchmarks/ab/ab_trees.sh) from each run's
JSON, including runs that measured one workload only and variants of the new tree (new_w0)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib import ab_report  # noqa: E402


def _write(run_dir: Path, name: str, result: dict) -> None:
    (run_dir / f"{name}.json").write_text(json.dumps(result))


def _rows(kind: str, run_dir: Path) -> dict[str, dict]:
    runs = [r for r in ab_report.load(run_dir) if r["kind"] == kind]
    return {row["metric"]: row for row in ab_report.summarize(kind, runs)["rows"]}


def test_llama8b_one_workload(tmp_path):
    """ab_workloads skips a workload sized 0: only what was measured is compared (a rate: new / base)."""
    for r, (base, new) in enumerate([(8000.0, 9000.0), (8400.0, 9200.0), (8200.0, 8800.0)], 1):
        _write(tmp_path, f"llama8b_base_r{r}", {"ab": {"sharegpt_like": {"output_tokens_per_s": base}}})
        _write(tmp_path, f"llama8b_new_r{r}", {"ab": {"sharegpt_like": {"output_tokens_per_s": new}}})
    rows = _rows("llama8b", tmp_path)
    assert list(rows) == ["sharegpt_like output tok/s"]
    row = rows["sharegpt_like output tok/s"]
    assert row["base_median"] == 8200.0 and row["new_median"] == 9000.0
    assert abs(row["new_vs_base"] - 9000.0 / 8200.0) < 1e-12


def test_json_times_and_constraints(tmp_path):
    """A time is compared as base / new; each constraint's runs stay apart."""
    _write(tmp_path, "json_regex_base_r1", {"runs": {"off": {"wall_s": 3.0}}})
    _write(tmp_path, "json_regex_new_r1", {"runs": {"off": {"wall_s": 2.0}}})
    _write(tmp_path, "json_json_schema_base_r1", {"runs": {"off": {"wall_s": 2.0}}})
    _write(tmp_path, "json_json_schema_new_r1", {"runs": {"off": {"wall_s": 4.0}}})
    rows = _rows("json", tmp_path)
    assert rows["regex off wall s"]["new_vs_base"] == 1.5
    assert rows["json_schema off wall s"]["new_vs_base"] == 0.5


def _spec_result(off: float, ngram: float) -> dict:
    return {"rows": [{"workload": "quote", "batch": 64, "algorithm": "off", "output_tokens_per_s": off,
                      "speedup_vs_off": 1.0},
                     {"workload": "quote", "batch": 64, "algorithm": "NGRAM", "output_tokens_per_s": ngram,
                      "speedup_vs_off": ngram / off}]}


def test_spec_variants_each_against_base(tmp_path):
    """Every tree named new* is compared with base; off has no speed-up row of its own."""
    _write(tmp_path, "spec_base_r1", _spec_result(1000.0, 1000.0))
    _write(tmp_path, "spec_new_r1", _spec_result(1000.0, 900.0))
    _write(tmp_path, "spec_new_w0_r1", _spec_result(1000.0, 990.0))
    rows = _rows("spec", tmp_path)
    assert abs(rows["quote b64 NGRAM vs off"]["new_vs_base"] - 0.9) < 1e-12
    assert abs(rows["quote b64 NGRAM vs off [new_w0]"]["new_vs_base"] - 0.99) < 1e-12
    assert "quote b64 off vs off" not in rows
    assert rows["quote b64 off tok/s [new_w0]"]["new_runs"] == [1000.0]


def test_names_outside_the_pattern_are_ignored(tmp_path):
    _write(tmp_path, "ab_llama8b", {"rows": []})  # a report in the same directory
    _write(tmp_path, "spec_other_r1", _spec_result(1.0, 1.0))  # not base, not new*
    assert ab_report.load(tmp_path) == []
