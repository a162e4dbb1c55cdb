"""benchmarks/programs/llava_bench.py's tiny path, shrunk: the LM program through sgl.Runtime with the radix cache on
and off; the server's counters give the hit rate and the encoder's runs; greedy answers do not depend on the cache."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.programs import llava_bench  # noqa: E402

pytestmark = pytest.mark.slow

IMAGES, QUESTIONS = 2, 3


def test_tiny_run(tmp_path):
    out = tmp_path / "r.json"
    report = llava_bench.main(["--tiny", "--images", str(IMAGES), "--questions", str(QUESTIONS), "--max-new-tokens",
                               "3", "--repeat", "1", "--modes", "radix", "no_radix", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    radix, no_radix = report["results"]
    for r in (radix, no_radix):
        assert r["programs"] == IMAGES and r["questions"] == IMAGES * QUESTIONS
        assert r["output_tokens"] == IMAGES * QUESTIONS * 3
        assert r["answers_equal_first_mode"] == IMAGES * QUESTIONS
        # each image encoded once: the fork's hint prefills it, the questions find it in the radix tree (radix) or
        # in the encoder cache (no_radix)
        assert r["images_encoded"] == IMAGES and 0 < r["encoder_share"] < 1
    assert radix["prompt_tokens"] == no_radix["prompt_tokens"]
    assert no_radix["cached_tokens"] == 0
    # the questions find their system prompt and image cached: most of the prompt tokens of this shape
    assert radix["hit_rate"] > 0.5
