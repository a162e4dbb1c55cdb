"""What a `radixlm serve` start-up costs the machine: wall time to the first healthy /health, and the CPU seconds of
each process of the server (main, and every process below it) when it is ready, over several start-ups of the
default model on this machine (a CPU-only machine: the suite's server tests start ~35 of these). Prints a table,
writes JSON. Run it in two trees side by side to compare them (the test machine's load moves absolute seconds).

    python benchmarks/startup/server_cpu.py --runs 3 --out /tmp/server_cpu.json [-- SERVE ARGS...]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds of root and every process below it."""
    stats = {int(d): s for d in os.listdir("/proc") if d.isdigit() and (s := _stat(int(d))) is not None}
    out, frontier = {}, [root]
    while frontier:
        out.update({p: stats[p][1] for p in frontier if p in stats})
        frontier = [p for p, (pp, _) in stats.items() if pp in frontier]
    return out


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[-60:]
    except OSError:
        return "?"


def one_start(serve_args: list[str], timeout_s: float) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port), "--log-level",
                             "warning", *serve_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}")
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"not healthy in {timeout_s} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        ready_s = time.perf_counter() - t0
        cpu = tree_cpu(proc.pid)
        return {"ready_s": round(ready_s, 2), "cpu_s": round(sum(cpu.values()), 2),
                "processes": [{"pid": p, "cmd": _cmd(p), "cpu_s": round(c, 2)} for p, c in cpu.items()]}
    finally:
        proc.terminate()
        proc.wait(60)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=180.0)
    p.add_argument("--out", required=True)
    p.add_argument("serve_args", nargs="*", help="after --: extra `radixlm serve` arguments")
    args = p.parse_args(argv)
    runs = [one_start(args.serve_args, args.timeout_s) for _ in range(args.runs)]
    result = {"benchmark": "server_cpu", "command": " ".join(sys.argv), "cpus": os.cpu_count(), "runs": runs,
              "median_ready_s": statistics.median(r["ready_s"] for r in runs),
              "median_cpu_s": statistics.median(r["cpu_s"] for r in runs)}
    for i, r in enumerate(runs):
        print(f"run {i}: ready {r['ready_s']:6.2f} s, CPU {r['cpu_s']:6.2f} s: "
              + ", ".join(f"{q['cpu_s']:.1f}" for q in r["processes"]))
    print(f"median: ready {result['median_ready_s']:.2f} s, CPU {result['median_cpu_s']:.2f} s")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
