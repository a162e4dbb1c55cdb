"""benchmarks/startup/startup_profile.py --tiny: the imports timed one by one and the engine's own thread profiled (its
build_scheduler, not only the caller's wait), figures that add up to the time to ready."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.startup import startup_profile  # noqa: E402


def test_tiny_start_up_profile(tmp_path):
    out = tmp_path / "startup.json"
    result = startup_profile.main(["--tiny", "--top", "60", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert [r["module"] for r in result["imports"]] == list(startup_profile.IMPORTS)
    assert all(r["ok"] for r in result["imports"])
    names = [r["function"] for r in result["top_cumulative"]]
    assert any(n.endswith(":build_scheduler") for n in names)  # profiled on the engine's thread
    setup = next(r for r in result["top_cumulative"] if r["function"].endswith(":_setup"))
    assert 0 < setup["cumulative_s"] <= result["engine_init_s"]
    assert result["imports_s"] + result["engine_init_s"] <= result["ready_s"] + 0.01
