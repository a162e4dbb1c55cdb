"""benchmarks/speculative.py --tiny: STANDALONE over a tiny random target and draft model (the default model's
tokenizer, dummy weights) replaying the target's recorded outputs, as the GPU path replays SmolLM2's on 8B shapes:
every pass runs, the outputs are the recording's in both modes, and the set draft acceptance is what verification
keeps."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import speculative  # noqa: E402


@pytest.mark.parametrize("acceptance, rounds", [(1.0, 2), (0.0, 1)])
def test_tiny_standalone_replay(tmp_path, acceptance, rounds):
    """rounds 2: each key's row is the median of its runs over both rounds (engines interleaved)."""
    out = tmp_path / "spec.json"
    ids = tmp_path / "ids.json"
    rows = speculative.main(["--tiny", "--workloads", "quote", "edit", "--batches", "1", "2", "--max-new-tokens", "16",
                             "--repeat", "1", "--rounds", str(rounds), "--stat", "median",
                             "--draft-acceptance", str(acceptance), "--save-ids", str(ids),
                             "--measure-window", "0", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["replay"]["draft_acceptance"] == acceptance and result["draft_model"]
    spec = [r for r in rows if r["algorithm"] == "STANDALONE"]
    assert len(spec) == 4 and len(rows) == 8
    assert result["settings"]["stat"] == "median" and all(len(r["runs_wall_s"]) == rounds for r in rows)
    for r in spec:
        assert r["identical_to_off"] == r["batch"]  # the recording, whatever the drafts
        assert r["model_drafts"] > 0 and r["draft_tokens"] > 0  # no draft controller (--measure-window 0)
        assert r["spec_controller_off_steps"] == r["spec_controller_on_steps"] == 0
        if acceptance == 1.0:
            assert r["accepted_draft_tokens"] == r["draft_tokens"]
        else:
            assert r["accepted_draft_tokens"] == 0
    recorded = json.loads(ids.read_text())
    assert sorted(recorded) == ["edit", "quote"] and all(len(v) == 16 for v in recorded.values())
