"""Soak test: starts its own radixlm targets on 127.0.0.1 (one server; or two workers behind a cache_aware router),
sends mixed valid, cancelled, aborted and malformed traffic (benchmarks/lib/soak_traffic.py) for a bounded time, and
checks that nothing answered an unexpected 5xx, that no process died, that the KV cache went back to idle and
how much resident memory grew.

    python benchmarks/serving/soak.py --target server|router|both [--duration 600] [--concurrency 8] [--max-requests N]

--quick is a ~20 s smoke run. Writes benchmarks/results/serving/soak_<target>.json; exits 1 when anything unexpected
happened (130 on Ctrl-C). The targets' logs go to a temporary folder (kept; --log-dir to choose it)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.lib.soak_traffic import (EXPECTED_OUTCOMES, MALFORMED, SPECS, WARMUP_KINDS, Mode,  # noqa: E402
                                         Outcome, Plan, Record, classify, pick, plan, report, sse_error,
                                         summarize)
from benchmarks.lib.targets import HOST, REPO, Target, start_target, stop_targets, wait_ready  # noqa: E402
from radixlm.bench.procs import free_port  # noqa: E402

REQUEST_TIMEOUT_S = 120.0
HEALTH_EVERY_S = 5.0
HEALTH_FAILURES_TO_DIE = 3
IDLE_TIMEOUT_S = 120.0
UNEXPECTED_LISTED = 20


def launch(kind: str, args: argparse.Namespace, log_dir: Path) -> tuple[list[Target], str]:
    """Starts the targets of `kind` and returns them with the URL the traffic goes to."""
    serve = [sys.executable, "-m", "radixlm.cli", "serve", "--host", HOST, "--model-path", args.model,
             "--max-total-tokens", str(args.max_total_tokens), "--context-length", str(args.context_length),
             "--max-running-requests", str(args.max_running_requests), "--max-queued-requests",
             str(args.max_queued_requests), "--log-level", args.server_log_level, *shlex.split(args.server_args)]
    targets: list[Target] = []
    try:
        if kind == "server":
            port = free_port()
            targets.append(start_target("server", [*serve, "--port", str(port)], port, log_dir, True))
        else:
            # Two workers share the cores: with a thread per core each, their threads would oversubscribe them
            # (the first router soak, with the default, served 403 requests in 10 min against the server's 5,595).
            threads = max(1, (os.cpu_count() or 2) // 2)
            for i in range(2):
                port = free_port()
                targets.append(start_target(f"worker{i}", [*serve, "--port", str(port)], port, log_dir, True, threads))
            wait_ready(targets)
            port = free_port()
            router = [sys.executable, "-m", "radixlm.cli", "router", "--host", HOST, "--port", str(port),
                      "--policy", "cache_aware", "--log-level", args.server_log_level,
                      "--worker-urls", *[t.url for t in targets]]
            targets.append(start_target("router", router, port, log_dir, False))
        wait_ready(targets)
    except BaseException:
        stop_targets(targets)
        raise
    return targets, targets[-1].url


class Soak:
    def __init__(self, url: str, targets: list[Target], args: argparse.Namespace) -> None:
        self.url, self.targets, self.args = url, targets, args
        self.rng = random.Random(args.seed)
        self.records: list[Record] = []
        self.events: list[dict] = []  # a death: a process gone or /health failing
        self.rss: list[dict] = []
        self.down: str | None = None
        self.sent = 0
        self.in_flight: dict[int, Plan] = {}  # after a death: the culprit is among these or the last finished
        self.t0 = time.monotonic()
        self.elapsed = 0.0
        self.stop = asyncio.Event()

    async def send(self, client: httpx.AsyncClient, p: Plan) -> Record:
        expect = SPECS[p.kind].expect
        t0 = time.perf_counter()
        status, retry_after, stream_err, detail, conn_err = None, False, None, "", False
        headers = {"content-type": "application/json"}
        self.in_flight[id(p)] = p
        try:
            if p.mode in (Mode.PLAIN, Mode.CANCEL_EARLY):
                call = client.request(p.method, self.url + p.path, content=p.content(), headers=headers)
                try:
                    r = await (asyncio.wait_for(call, p.cancel_after_s) if p.mode is Mode.CANCEL_EARLY else call)
                except asyncio.TimeoutError:
                    return Record(p.kind, None, Outcome.CANCELLED, time.perf_counter() - t0, p.snippet())
                status, retry_after, detail = r.status_code, "retry-after" in r.headers, r.text[:300]
            else:
                async with client.stream(p.method, self.url + p.path, content=p.content(), headers=headers) as r:
                    status, retry_after = r.status_code, "retry-after" in r.headers
                    chunks: list[str] = []
                    async for chunk in r.aiter_text():
                        chunks.append(chunk)
                        if r.status_code != 200:
                            continue
                        if p.mode is Mode.CANCEL_STREAM:
                            break  # leaving the block closes the connection mid-stream
                        if p.mode is Mode.OPERATOR_ABORT and len(chunks) == 1:
                            a = await client.post(self.url + "/abort_request", json={"rid": p.rid})
                            if not 200 <= a.status_code < 300:
                                status, detail = a.status_code, "abort_request: " + a.text[:300]
                    text = "".join(chunks)
                    stream_err = sse_error(text) if r.status_code == 200 else None
                    detail = detail or (stream_err or text[:300])
                if p.mode is Mode.CANCEL_STREAM and status == 200 and stream_err is None:
                    return Record(p.kind, status, Outcome.CANCELLED, time.perf_counter() - t0, p.snippet())
        except httpx.HTTPError as e:
            conn_err, detail = True, repr(e)[:300]
        finally:
            self.in_flight.pop(id(p), None)
        if (conn_err or stream_err or (status or 0) >= 500) and self.down is None:
            self.check_alive()
        outcome = classify(expect, status, retry_after, stream_err, conn_err, self.down is not None)
        return Record(p.kind, status, outcome, time.perf_counter() - t0, p.snippet(), detail)

    def check_alive(self) -> None:
        for t in self.targets:
            if (why := t.dead_reason()) is not None:
                self.died(why, t)
                return

    def died(self, why: str, t: Target) -> None:
        if self.down is None:
            self.down = why
            self.events.append({"t_s": round(time.monotonic() - self.t0, 1), "event": "died", "what": why,
                                "in_flight": [p.snippet() for p in self.in_flight.values()],
                                "last_finished": [r.request for r in self.records[-5:]], "log_tail": t.log_tail()})
            print(f"!! {why}: stopping early", flush=True)
            self.stop.set()

    async def client_loop(self, client: httpx.AsyncClient, deadline: float) -> None:
        while not self.stop.is_set() and time.monotonic() < deadline and self.sent < self.args.max_requests:
            self.sent += 1
            kind = pick(self.rng)
            self.records.append(await self.send(client, plan(kind, self.rng)))

    def sample_rss(self, label: str) -> None:
        procs = {t.name: t.rss_by_process() for t in self.targets}
        self.rss.append({"t_s": round(time.monotonic() - self.t0, 1), "at": label,
                         **{name: round(sum(p.values()), 1) for name, p in procs.items()}, "processes": procs})

    async def monitor(self, client: httpx.AsyncClient, deadline: float) -> None:
        failures = {t.name: 0 for t in self.targets}
        next_health, next_rss = time.monotonic(), self.t0 + self.args.rss_interval
        while not self.stop.is_set() and time.monotonic() < deadline:
            self.check_alive()
            now = time.monotonic()
            if now >= next_rss:
                self.sample_rss("interval")
                next_rss = now + self.args.rss_interval
            if now >= next_health:
                next_health = now + HEALTH_EVERY_S
                for t in self.targets:
                    try:
                        ok = (await client.get(t.url + "/health", timeout=10)).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    failures[t.name] = 0 if ok else failures[t.name] + 1
                    if failures[t.name] >= HEALTH_FAILURES_TO_DIE:
                        self.died(f"{t.name}: /health failed {failures[t.name]} times in a row", t)
            await asyncio.sleep(1.0)

    async def run(self) -> list[Record]:
        c = self.args.concurrency
        limits = httpx.Limits(max_connections=2 * c + 8, max_keepalive_connections=2 * c)
        async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10), limits=limits) as client:
            warmup = [await self.send(client, plan(k, self.rng)) for k in WARMUP_KINDS]
            print(f"== warmed up; soaking {self.args.duration:.0f} s at concurrency {c}", flush=True)
            self.t0 = time.monotonic()
            self.sample_rss("start")
            deadline = self.t0 + self.args.duration
            clients = [asyncio.create_task(self.client_loop(client, deadline)) for _ in range(c)]
            mon = asyncio.create_task(self.monitor(client, deadline))
            done = asyncio.gather(*clients, return_exceptions=True)
            stopped = asyncio.ensure_future(self.stop.wait())
            try:
                await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
                # Normal end: in-flight requests finish (bounded); after a death, they get a short grace.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(done), 10 if self.down else REQUEST_TIMEOUT_S + 10)
            finally:  # also on Ctrl-C: no task may outlive the client
                for task in (*clients, mon, stopped):
                    task.cancel()
                await asyncio.gather(done, mon, stopped, return_exceptions=True)
            for task in clients:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # a bug in the soak itself
            self.elapsed = time.monotonic() - self.t0
        return warmup


async def kv_idle_check(targets: list[Target], url: str) -> list[dict]:
    """Waits until each server is idle; its KV pool must then be all free or evictable (nothing leaked)."""
    out = []
    async with httpx.AsyncClient(timeout=30) as client:
        for t in (t for t in targets if t.is_server):
            deadline, state, ok, err = time.monotonic() + IDLE_TIMEOUT_S, {}, False, None
            while not ok and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                try:
                    state = (await client.get(t.url + "/server_info")).json()["internal_states"][0]
                    ok = (state["available_tokens"] + state["evictable_tokens"] == state["max_total_num_tokens"]
                          and state["num_running_reqs"] == 0 == state["num_waiting_reqs"])
                except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
                    err = repr(e)
            keys = ("max_total_num_tokens", "available_tokens", "evictable_tokens", "protected_tokens",
                    "num_running_reqs", "num_waiting_reqs", "is_idle")
            out.append({"target": t.name, "idle_ok": ok, **{k: state.get(k) for k in keys}, "last_error": err})
        try:  # the target still serves after the soak
            r = await client.post(url + "/generate", json={"text": "The capital of France is",
                                                           "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            out.append({"target": "final_generate", "idle_ok": r.status_code == 200, "status": r.status_code})
        except httpx.HTTPError as e:
            out.append({"target": "final_generate", "idle_ok": False, "error": repr(e)})
    return out


def soak_one(kind: str, args: argparse.Namespace, log_dir: Path) -> bool:
    print(f"== target {kind}: starting (logs in {log_dir})", flush=True)
    t_start = time.monotonic()
    targets, url = launch(kind, args, log_dir)
    try:
        print(f"== ready in {time.monotonic() - t_start:.0f} s; warming up", flush=True)
        soak = Soak(url, targets, args)
        warmup = asyncio.run(soak.run())
        kv = asyncio.run(kv_idle_check(targets, url)) if soak.down is None else []
        soak.check_alive()
        if soak.down is None:  # after a death the last interval sample is the end
            soak.sample_rss("end")
    finally:
        stop_targets(targets)
    records = soak.records
    unexpected = [r for r in warmup + records if r.outcome not in EXPECTED_OUTCOMES]
    start, end = soak.rss[0], soak.rss[-1]
    rss = {t.name: {"start_mib": start[t.name], "end_mib": end[t.name],
                    "growth_mib": round(end[t.name] - start[t.name], 1)} for t in targets}
    failures = ([f"{len(unexpected)} unexpected responses"] if unexpected else []) + [e["what"] for e in soak.events]
    failures += [f"KV not idle on {c['target']}" for c in kv if not c["idle_ok"]]
    failures += ["no KV check (a target died)"] if not kv else []
    failures += [f"{n}: RSS grew {v['growth_mib']} MiB" for n, v in rss.items()
                 if v["growth_mib"] > args.max_rss_growth_mib]
    stats = summarize(records)
    result = {
        "benchmark": "soak", "target": kind, "command": shlex.join([sys.executable, *sys.argv]),
        "git_commit": _git("rev-parse", "HEAD"), "git_dirty_files": len(_git("status", "--porcelain").splitlines()),
        "duration_s": args.duration, "elapsed_s": round(soak.elapsed, 1), "concurrency": args.concurrency,
        "max_requests": args.max_requests, "requests": len(records), "seed": args.seed,
        "targets": {t.name: t.url for t in targets}, "log_dir": str(log_dir),
        "counts": {k: dataclasses.asdict(v) for k, v in stats.items()},
        "malformed_statuses": {k.value: stats[k.value].statuses for k in SPECS if k in MALFORMED and k.value in stats},
        "outcomes": {o.value: sum(1 for r in records if r.outcome is o) for o in Outcome},
        "warmup": [{"kind": r.kind.value, "status": r.status, "outcome": r.outcome.value} for r in warmup],
        "unexpected_total": len(unexpected),
        "unexpected": [{"kind": r.kind.value, "status": r.status, "outcome": r.outcome.value, "request": r.request,
                        "response": r.detail} for r in unexpected[:UNEXPECTED_LISTED]],
        "events": soak.events, "kv_idle_check": kv, "rss_mib": rss, "rss_series": soak.rss,
        "max_rss_growth_mib": args.max_rss_growth_mib, "failures": failures, "pass": not failures,
    }
    print(report(result, stats), flush=True)
    out = Path(args.out.format(target=kind))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return result["pass"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=("server", "router", "both"), default="server")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic per target")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-requests", type=int, default=1_000_000, help="hard cap on requests per target")
    p.add_argument("--quick", action="store_true", help="smoke run: 20 s of traffic, RSS every 5 s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="default", help="SmolLM2-135M-Instruct")
    p.add_argument("--max-total-tokens", type=int, default=8192)
    p.add_argument("--context-length", type=int, default=1024)
    p.add_argument("--max-running-requests", type=int, default=8)
    p.add_argument("--max-queued-requests", type=int, default=32)
    p.add_argument("--server-args", default="", help="more `radixlm serve` flags, one string")
    p.add_argument("--server-log-level", default="warning")
    p.add_argument("--rss-interval", type=float, default=30.0, help="seconds between RSS samples")
    p.add_argument("--max-rss-growth-mib", type=float, default=256.0, help="per target process group")
    p.add_argument("--log-dir", default=None, help="the targets' logs (default: a new folder under the temp dir)")
    p.add_argument("--out", default="benchmarks/results/serving/soak_{target}.json")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.rss_interval = 20.0, 5.0
    if args.duration <= 0 or args.concurrency < 1 or args.max_requests < 1:
        p.error("--duration, --concurrency and --max-requests must be positive")
    if {"--host", "--port", "--dp-size"} & {a.split("=")[0] for a in shlex.split(args.server_args)}:
        p.error("--server-args: the soak chooses --host (loopback), --port and the topology itself")
    if args.target == "both" and "{target}" not in args.out:
        p.error("--out needs '{target}' with --target both")
    return args


def _git(*cmd: str) -> str:
    return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True).stdout.strip()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up as Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (SIG_IGN)
    kinds = ["server", "router"] if args.target == "both" else [args.target]
    root = Path(args.log_dir or tempfile.mkdtemp(prefix="soak_logs_"))
    ok = True
    try:
        for kind in kinds:
            log_dir = root / kind
            log_dir.mkdir(parents=True, exist_ok=True)
            ok = soak_one(kind, args, log_dir) and ok
    except KeyboardInterrupt:
        print("interrupted: targets stopped", file=sys.stderr)
        return 130
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
