"""Per-request results and the aggregate report of a serving benchmark."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_len: int = 0  # server-reported prompt tokens when known, else the dataset's count
    output_len: int = 0
    cached_tokens: int | None = None
    ttft: float = 0.0  # seconds
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0


@dataclass
class ClientRun:
    """One load-generator process's run: its results, its start (perf_counter, shared by all the processes of a
    run: CLOCK_MONOTONIC is one clock for the host), its end, and the CPU seconds (user + sys) it spent."""
    results: list[RequestResult]
    start: float
    end: float
    cpu_s: float


# A process using more than this share of one core is what limits the measured throughput, not the server.
CLIENT_BOUND_UTILIZATION = 0.8


def merge_runs(runs: list[ClientRun]) -> tuple[list[RequestResult], float]:
    """All processes' results and the run's duration, from the shared start to the last process's end: what one
    process sending every request would report."""
    if not runs:
        raise ValueError("no client runs to merge")
    return [r for run in runs for r in run.results], max(run.end for run in runs) - min(run.start for run in runs)


def client_report(runs: list[ClientRun], output_tokens: int) -> dict:
    """The load generator's own CPU: per process the cores it used over its run; client_bound when any process
    used more than CLIENT_BOUND_UTILIZATION of a core (then the figures are the client's ceiling)."""
    util = [run.cpu_s / (run.end - run.start) if run.end > run.start else 0.0 for run in runs]
    cpu = sum(run.cpu_s for run in runs)
    return {"processes": len(runs), "cpu_s": cpu, "cpu_utilization": util,
            "cpu_us_per_output_token": cpu / output_tokens * 1e6 if output_tokens else 0.0,
            "client_bound": max(util) > CLIENT_BOUND_UTILIZATION}


def _stats(values_s: list[float]) -> dict[str, float]:
    if not values_s:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    a = np.asarray(values_s) * 1000.0
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99))}


def summarize(results: list[RequestResult], duration_s: float) -> dict:
    done = [r for r in results if r.ok]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_len for r in done)
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in done if r.output_len > 1]
    report = {
        "duration_s": duration_s,
        "completed": len(done),
        "failed": len(results) - len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration_s if duration_s > 0 else 0.0,
        "input_throughput": total_in / duration_s if duration_s > 0 else 0.0,
        "output_throughput": total_out / duration_s if duration_s > 0 else 0.0,
        "ttft_ms": _stats([r.ttft for r in done]),
        "itl_ms": _stats([x for r in done for x in r.itl]),
        "tpot_ms": _stats(tpots),
        "e2e_latency_ms": _stats([r.latency for r in done]),
        "total_cached_tokens": None,
        "cache_hit_rate": None,
    }
    with_cache = [r for r in done if r.cached_tokens is not None]
    if with_cache:
        cached = sum(r.cached_tokens for r in with_cache)
        prompt = sum(r.prompt_len for r in with_cache)
        report["total_cached_tokens"] = cached
        report["cache_hit_rate"] = cached / prompt if prompt else 0.0
    errors = sorted({r.error for r in results if not r.ok})
    if errors:
        report["errors"] = errors[:5]
    return report


def format_report(rep: dict, title: str) -> str:
    rows: list[tuple[str, str]] = [
        ("Duration (s)", f"{rep['duration_s']:.2f}"),
        ("Completed requests", str(rep["completed"])),
        ("Failed requests", str(rep["failed"])),
        ("Total input tokens", str(rep["total_input_tokens"])),
        ("Total output tokens", str(rep["total_output_tokens"])),
        ("Request throughput (req/s)", f"{rep['request_throughput']:.2f}"),
        ("Input token throughput (tok/s)", f"{rep['input_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{rep['output_throughput']:.2f}"),
    ]
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"), ("e2e_latency_ms", "E2E latency")):
        for stat in ("mean", "median", "p99"):
            rows.append((f"{stat.capitalize()} {name} (ms)", f"{rep[key][stat]:.2f}"))
    if rep["cache_hit_rate"] is not None:
        rows.append(("Cached tokens", str(rep["total_cached_tokens"])))
        rows.append(("Cache hit rate", f"{rep['cache_hit_rate']:.2%}"))
    if "client" in rep:
        c = rep["client"]
        rows.append(("Client processes", str(c["processes"])))
        rows.append(("Client CPU us / output token", f"{c['cpu_us_per_output_token']:.2f}"))
        rows.append(("Client max core utilisation", f"{max(c['cpu_utilization']):.0%}"))
        rows.append(("Client bound", "YES" if c["client_bound"] else "no"))
    width = max(len(k) for k, _ in rows) + 2
    line = "=" * (width + 14)
    body = "\n".join(f"{k:<{width}}{v:>14}" for k, v in rows)
    return f"{line}\n{title:^{width + 14}}\n{line}\n{body}\n{line}"
