"""benchmarks/speculative/speculative.py --tiny: STANDALONE over a tiny random target and draft model (the default model's
tokenizer, dummy weights) replaying the target's recorded outputs, as the GPU path replays SmolLM2's on 8B shapes:
every pass runs, the outputs are the recording's in both modes, and the set draft acceptance is what verification
keeps."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.speculative import speculative  # noqa: E402


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


def test_paired_off_times_drafting_off_on_the_speculative_engine(tmp_path, monkeypatch):
    """--paired-off: each NGRAM run is followed by one on the same engine with the n-gram source left out (rows
    'off@NGRAM': no drafts, the recording's tokens); 'paired' is the median of the per-pair speed ratios. The tiny
    target replays SmolLM2's recorded quote, which the n-gram source drafts from the prompt (the GPU path's run)."""
    from benchmarks.lib import speculative_replay

    monkeypatch.setattr(sys, "argv", ["speculative_replay.py", "default", str(tmp_path / "t"), "--tiny"])
    speculative_replay.main()
    ids = speculative_replay.RECORDINGS["default"]
    rows = speculative.main(["--model", str(tmp_path / "t"), "--load-format", "dummy", "--device", "cpu",
                             "--dtype", "float32", "--script-ids", str(ids), "--algorithms", "NGRAM",
                             "--workloads", "quote", "--batches", "1", "--max-new-tokens", "16", "--repeat", "2",
                             "--measure-window", "0", "--paired-off", "--out", str(tmp_path / "spec.json")])
    by = {r["algorithm"]: r for r in rows}
    assert set(by) == {"off", "NGRAM", "off@NGRAM"}
    ngram, twin = by["NGRAM"], by["off@NGRAM"]
    assert ngram["ngram_drafts"] > 0 and twin["ngram_drafts"] == twin["draft_tokens"] == 0
    assert twin["identical_to_off"] == ngram["identical_to_off"] == 1 and len(twin["runs_wall_s"]) == 2
    # each off run prefills the prompt its NGRAM twin prefilled (not a hit on what the twin left in the cache)
    assert twin["runs_prefill_tokens"] == ngram["runs_prefill_tokens"] and min(ngram["runs_prefill_tokens"]) > 0
    ratios = [t / w for t, w in zip(twin["runs_wall_s"], ngram["runs_wall_s"])]
    assert ngram["speedup_vs_paired_off"] == pytest.approx(sum(ratios) / 2)  # the median of two
    assert by["off"]["speedup_vs_paired_off"] is None


QWEN_CODER = "qwen2.5-coder-0.5b-instruct"


def test_replay_shapes_of_another_recording_model(tmp_path, monkeypatch, capsys):
    """speculative_replay.py with a non-default recording model: 8B shapes with its vocabulary, tokenizer and stop
    tokens; without a draft directory, the target only."""
    from benchmarks.lib import speculative_replay
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer

    monkeypatch.setattr(sys, "argv", ["speculative_replay.py", QWEN_CODER, str(tmp_path / "t8b")])
    speculative_replay.main()
    assert not (tmp_path / "d1b").exists() and str(tmp_path / "t8b") in capsys.readouterr().out
    config = json.loads((tmp_path / "t8b" / "config.json").read_text())
    tok = get_tokenizer(str(tmp_path / "t8b"))
    assert config["vocab_size"] == 151936 >= len(tok) > 151000 and config["hidden_size"] == 4096
    assert 151645 in config["eos_token_id"] and tok.convert_tokens_to_ids("<|im_end|>") == 151645
    recorded = json.loads(Path(speculative_replay.RECORDINGS[QWEN_CODER]).read_text())
    assert sorted(recorded) == ["edit", "quote", "restate", "story"]
    assert all(0 <= t < config["vocab_size"] for ids in recorded.values() for t in ids)
    assert "self.stock = {}" in tok.decode(recorded["edit"])  # the coder model performs the rename


def test_tiny_replay_with_another_recording_model(tmp_path):
    """--tiny --model M: the tiny target and draft carry M's tokenizer and vocabulary."""
    out = tmp_path / "spec.json"
    rows = speculative.main(["--tiny", "--model", QWEN_CODER, "--workloads", "edit", "--batches", "1",
                             "--max-new-tokens", "8", "--repeat", "1", "--measure-window", "0",
                             "--out", str(out)])
    result = json.loads(out.read_text())
    for model in (result["model"], result["draft_model"]):
        assert json.loads((Path(model) / "config.json").read_text())["vocab_size"] == 151936
    assert all(r["identical_to_off"] == 1 for r in rows) and len(rows) == 2
