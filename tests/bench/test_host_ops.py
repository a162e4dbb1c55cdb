"""benchmarks/grammar/host_ops.py on the CPU: a small recording (json_decoding.py --save-ids's format: one list of
output ids per prompt of json_workload.passages(n, 0), EOS last) replayed with scripted logits through
json_workload.run_mode for modes off and fast, the default model's layers stubbed (--keep-model). Checks the per-pass
counts (Python calls, then bytecodes), that `off` replays the recording token for token, and that --compare of a file
with itself reports equal outputs and no differences."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.grammar import host_ops  # noqa: E402

N_PROMPTS = 3


def _recording(path: Path) -> list[list[int]]:
    """What SmolLM2 writes for these passages under the schema (json.dumps's separators, EOS after the object),
    built from each passage's own fields so that no model has to run."""
    from benchmarks.lib import json_workload
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer

    tok = get_tokenizer("default")
    eos = tok.eos_token_id
    ids = []
    for text in json_workload.passages(N_PROMPTS, 0):
        city, country = re.match(r"(\w+) is a city in (\w+)", text).groups()
        obj = {"name": city, "country": country,
               "latitude": float(re.search(r"latitude (-?\d+\.\d+)", text).group(1)),
               "population": int(re.search(r"about (\d+) inhabitants", text).group(1)),
               "top 3 landmarks": ["Old Market", "River", "Museum"], "is_capital": False}
        ids.append(tok.encode(json.dumps(obj), add_special_tokens=False) + [eos])
    path.write_text(json.dumps(ids))
    return ids


def _host_ops(monkeypatch, capsys, *argv: str) -> str:
    monkeypatch.setattr(sys, "argv", ["host_ops.py", *argv])
    monkeypatch.setattr(sys, "path", list(sys.path))  # measure() puts the tree first on the path
    host_ops.main()
    return capsys.readouterr().out


def test_host_ops_counts_and_compare(tmp_path, monkeypatch, capsys):
    ids_path = tmp_path / "ids.json"
    recorded = _recording(ids_path)
    common = ["--tree", str(ROOT), "--ids", str(ids_path), "--constraint", "json_schema", "--modes", "off,fast",
              "--keep-model", "--max-running", "4", "--max-total-tokens", "4096"]  # 4096: 190 MB of KV, not 6 GB

    calls_out = tmp_path / "calls.json"
    printed = _host_ops(monkeypatch, capsys, *common, "--count", "calls", "--out", str(calls_out))
    calls = json.loads(calls_out.read_text())
    assert list(calls) == ["off", "fast"]
    for mode, r in calls.items():
        assert f"{mode}: {r['passes']} passes, calls/pass" in printed
        assert r["count"] == "calls" and r["passes"] > 0 and r["per_pass"] > 0
        assert r["passes"] == r["sched_stats"]["prefill_batches"] + r["sched_stats"]["decode_batches"]
        assert r["steps"] >= r["passes"]  # every pass is a counted step (the last step finds nothing to run)
        assert r["total"] == sum(r["funcs"].values()) and r["per_pass"] == pytest.approx(r["total"] / r["passes"])
        sched = {k for k in r["funcs"] if k.startswith("radixlm/runtime/scheduler/")}
        assert "radixlm/runtime/scheduler/scheduler.py:get_next_batch_to_run" in sched
        # the counted step calls each pass's scheduling at least once per pass
        assert r["funcs"]["radixlm/runtime/scheduler/scheduler.py:get_next_batch_to_run"] >= r["passes"]
        assert len(r["ids"]) == N_PROMPTS and r["output_tokens"] == sum(map(len, r["ids"]))
        assert all(ids[-1] == recorded[0][-1] for ids in r["ids"])  # each ends at EOS, not at max_new_tokens
    off, fast = calls["off"], calls["fast"]
    assert off["ids"] == recorded  # the scripted logits replay the recording
    assert off["passes"] == max(map(len, recorded))  # one prefill, then one decode pass per further token
    assert fast["sched_stats"]["jump_decode_batches"] > 0 and fast["passes"] < off["passes"]

    printed = _host_ops(monkeypatch, capsys, "--compare", str(calls_out), str(calls_out), "--top", "10")
    headers = re.findall(r"^== (\w+) \(calls\): .*outputs equal: (\w+)$", printed, re.M)
    assert headers == [("off", "True"), ("fast", "True")]
    diffs = re.findall(r"^ +(-?[\d.]+) +(-?[\d.]+) +([+-][\d.]+)  (\S.*)$", printed, re.M)
    assert diffs and all(float(d) == 0 and float(a) == float(b) for a, b, d, _ in diffs)
    assert any("radixlm/runtime/scheduler/" in name for *_, name in diffs)

    codes_out = tmp_path / "bytecodes.json"
    _host_ops(monkeypatch, capsys, *common, "--modes", "off", "--count", "bytecodes", "--out", str(codes_out))
    codes = json.loads(codes_out.read_text())["off"]
    assert codes["ids"] == recorded and codes["passes"] == off["passes"]
    assert codes["total"] == sum(codes["funcs"].values()) and codes["per_pass"] > off["per_pass"]  # many per call
    assert codes["funcs"]["radixlm/runtime/scheduler/scheduler.py:get_next_batch_to_run"] > 0
    # the scripted logits and the model stub are paused; the calls count sees them
    assert "benchmarks/lib/json_workload.py:_logits" in off["funcs"]
    assert not any(k.endswith(":_logits") or "host_ops.py" in k for k in codes["funcs"])

    printed = _host_ops(monkeypatch, capsys, "--compare", str(calls_out), str(codes_out))
    assert "== off (calls)" in printed and "outputs equal: True" in printed and "== fast" not in printed
