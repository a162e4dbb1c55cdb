"""benchmarks/profiling/profile_workloads.py --tiny (the CPU dry run of issue 20's profiles): every field the GPU run
reports is there, and the profiles are not empty (passes of each kind with their ops, host phases, idle shares)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.profiling import profile_workloads  # noqa: E402


def _check_window(w: dict, kinds: tuple[str, ...]) -> None:
    assert w["wall_us"] > 0 and w["device_busy_us"] > 0 and 0 <= w["gpu_idle_share"] <= 1
    for kind in kinds:
        assert w["passes"][kind] > 0
        d = w["by_kind"][kind]
        assert d["device_us"] > 0 and d["kernels"], kind
        assert all(k["us"] > 0 and k["calls"] > 0 and k["name"] for k in d["kernels"])


def test_tiny_profile(tmp_path):
    out = tmp_path / "profile.json"
    profile_workloads.main(["--tiny", "--parts", "shared_prefix", "decode256", "--out", str(out)])
    result = json.loads(out.read_text())
    m = result["shared_prefix"]["measured"]
    assert m["requests"] == 8 and m["output_tokens"] == 128 and m["wall_s"] > 0 and m["output_tokens_per_s"] > 0
    assert m["passes_by_kind"]["prefill"] > 0 and m["passes_by_kind"]["decode"] > 0
    assert m["passes"] == sum(m["passes_by_kind"].values())
    assert m["prefill_tokens_computed"] > 0 and 0 < m["hit_rate"] < 1  # the prefixes are shared within a group
    assert m["host_phases"]["scheduler step"]["calls"] > 0 and m["host_busy_us_per_pass"] > 0
    assert set(m["host_launch_us_per_pass"]) == set(m["passes_by_kind"])
    assert 0 <= m["gpu_idle_share_estimate"] <= 1
    windows = result["shared_prefix"]["profiled"]["windows"]
    assert windows["start"]["first_pass"] == 0
    _check_window(windows["start"], ("prefill",))
    _check_window(windows["steady"], ("decode",))
    d = result["decode256"]
    assert d["batch"] == 4 and "scheduler step" in d["host"]["phases_us_per_step"]  # (a difference: noisy on the CPU)
    _check_window(d["window"], ("decode",))
    assert set(d["window"]["passes"]) == {"decode"}


def test_tiny_host_profile(tmp_path):
    """--window 0 --cprofile N: no torch.profiler run; a cProfile'd run's table of the scheduler's hot spots."""
    out = tmp_path / "host.json"
    profile_workloads.main(["--tiny", "--parts", "shared_prefix", "--window", "0", "--cprofile", "12",
                            "--out", str(out)])
    r = json.loads(out.read_text())["shared_prefix"]
    assert "profiled" not in r and r["measured"]["passes"] > 0
    host = r["host_profile"]
    assert host["wall_s"] > 0 and "ncalls" in host["by_tottime"] and "function calls" in host["by_tottime"]


def test_summarize_counts_only_kernels_under_a_pass():
    """Kernels attributed by their launching op's enclosing pass annotation; the annotation's own device span is
    neither a kernel nor busy time; a kernel no op claims is listed as unlinked."""
    from types import SimpleNamespace as NS

    import torch

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    tag = profile_workloads.TAG
    pass_ev = NS(name=tag + "decode", cpu_parent=None, device_type=cpu, kernels=[NS(name=tag + "decode", duration=50)])
    op = NS(name="aten::mm", cpu_parent=pass_ev, device_type=cpu, kernels=[NS(name="gemm", duration=30)])
    stray = NS(name="aten::copy_", cpu_parent=None, device_type=cpu, kernels=[NS(name="memcpy", duration=5)])
    dev = [NS(name=n, device_type=cuda, time_range=NS(start=a, end=b))
           for n, a, b in ((tag + "decode", 0, 50), ("gemm", 10, 40), ("memcpy", 60, 65), ("gemm", 70, 72))]
    s = profile_workloads.summarize([pass_ev, op, stray, *dev], True, {"decode": 1}, 100.0)
    assert s["device_busy_us"] == 37 and s["device_kernel_us"] == 37 and s["unlinked_kernel_us"] == 2
    assert s["by_kind"]["decode"]["kernels"][0]["name"] == "gemm" and s["by_kind"]["decode"]["device_us"] == 30
    assert s["by_kind"]["other"]["device_us"] == 5 and s["gpu_idle_share"] == 0.63
    assert s["by_kind"]["unlinked"]["kernels"] == [{"name": "gemm", "us": 2, "us_per_pass": 2, "calls": 1, "share": 1}]
