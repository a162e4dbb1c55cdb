"""Two radixlm workers behind `radixlm router`, one benchmark per --kind (each kind's options: `--kind K --help`).

--kind dp (data-parallel serving): two workers (on one GPU, each with its own KV pool; one per GPU with --worker-gpus;
or on the CPU), the generated-shared-prefix workload, `cache_aware` vs `round_robin`: throughput, the workers' cache
hit rate (cached / prompt tokens, from /v1/loads) and how the requests spread over the workers. The KV pools are sized
so that every group's prefix fits in the two pools together but not in one: routing decides whether each prefix is
cached once or on both workers (and evicted). With prompts arriving in rounds (interleaved sessions), a worker that
sees every group cycles through more prefixes than it holds; with a shuffled order some of a group's prompts still
arrive close together. `--model llama-3.1-8b` is the Llama-3.1-8B architecture kept in benchmarks/models (use
--load-format dummy). On two GPUs: benchmarks/lease/multi_gpu_lease.sh c.

--kind feedback (how honest is the router's approximate tree?): two CPU workers with small KV pools behind a
cache_aware router, a generated-shared-prefix workload with more prompt groups than the pools hold (so the workers
evict), run once without and once with `--cache-feedback`. Reported per run: the router's estimated hit rate (tree
match characters / input characters), the workers' reported hit rate (cached / prompt tokens of the proxied
responses), their absolute gap, the feedback corrections made, and throughput. Writes
benchmarks/results/serving/router_feedback_cpu.json.

--kind pd (prefill/decode disaggregation against co-located replicas on two GPUs, for an `nvidia-h200-x2`
lease): A. one prefill server on GPU 0 and one decode server on GPU 1 behind `radixlm router --pd-disaggregation`
(--prefill-policy cache_aware --decode-policy power_of_two); B. two plain replicas, one per GPU, behind `radixlm router
--policy cache_aware`. Both driven by `radixlm.bench.serving` with random prompts of 4k-8k tokens at a fixed Poisson
request rate: TTFT, inter-token latency (median, p99) and throughput. The issue's bar: PD's ITL p99 <= 0.5x
co-located at equal throughput. Writes benchmarks/results/serving/pd_vs_colocated.json.

    python benchmarks/serving/router.py --kind dp --model llama-3.1-8b --load-format dummy --device cuda \\
        --dtype bfloat16 --max-total-tokens 70000 --num-groups 32 --prompts-per-group 8 --system-prompt-len 4096 \\
        --question-len 64 --output-len 16 --max-concurrency 16 --order rounds --out router_dp_gpu.json
    python benchmarks/serving/router.py --kind feedback [--num-groups 16] [--rounds 5] [--system-prompt-words 200]
        [--max-total-tokens 1536] [--output-len 8] [--max-concurrency 4]
    python benchmarks/serving/router.py --kind pd [--model-path llama-3.1-8b] [--load-format dummy]
        [--request-rate 2 [3 ...]] [--num-prompts 200] [--input-len 8192] [--output-len 256] [--out PATH]
    python benchmarks/serving/router.py --kind pd --model-path tiny --device cpu --dtype float32 --gpus none none \
        --num-prompts 6 --input-len 256 --output-len 8 --request-rate 4 --out /tmp/pd_smoke.json   # CPU smoke
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.kinds import parse_kind  # noqa: E402
from benchmarks.lib.router_runs import (drive, evicted, feedback_workload, start_server, start_workers,  # noqa: E402
                                        stop_all, worker_stats)
from radixlm.bench.datasets import GSP_ORDERS  # noqa: E402
from radixlm.bench.procs import free_port, start, stop, wait_ready  # noqa: E402
from radixlm.bench.serving import main as bench_main  # noqa: E402

SCRIPT = "benchmarks/serving/router.py"
RESULTS = Path(__file__).resolve().parents[1] / "results" / "serving"
PD_READY_TIMEOUT_S = 900


class Kind(str, Enum):
    DP = "dp"
    FEEDBACK = "feedback"
    PD = "pd"


def router_cmd(port: int, flags: list[str]) -> list[str]:
    return [sys.executable, "-m", "radixlm.router", "--port", str(port), "--log-level", "warning", *flags]


def hit_counts(before: list[dict], after: list[dict]) -> tuple[list[int], list[int]]:
    return ([a["cached_tokens_total"] - b["cached_tokens_total"] for a, b in zip(after, before)],
            [a["prompt_tokens_total"] - b["prompt_tokens_total"] for a, b in zip(after, before)])


# ------------------------------------------------------------------------------------------------------------ dp
def dp_args(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--load-format", default="auto", help="dummy: random weights (with --model llama-3.1-8b)")
    p.add_argument("--order", default="shuffled", choices=GSP_ORDERS, help="arrival order of the prompts")
    p.add_argument("--max-total-tokens", type=int, default=40000)
    p.add_argument("--num-groups", type=int, default=32)
    p.add_argument("--prompts-per-group", type=int, default=8)
    p.add_argument("--system-prompt-len", type=int, default=1024)
    p.add_argument("--question-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--worker-gpus", nargs="+", default=None,
                   help="one CUDA_VISIBLE_DEVICES value per worker (one replica per GPU); default: all share the device")
    p.add_argument("--single-replica", action="store_true", help="also send the workload to one worker alone")
    p.add_argument("--out", default="benchmarks/results/serving/router_dp.json")


def dp_single(worker: str, bench_args: list[str]) -> dict:
    """The same workload sent to one worker directly: what one replica does alone."""
    httpx.post(worker + "/flush_cache", timeout=60)
    before = worker_stats([worker])
    report = bench_main(["--port", worker.rsplit(":", 1)[1], *bench_args])
    (cached,), (prompt,) = hit_counts(before, worker_stats([worker]))
    report.pop("config", None)
    return {"policy": "one replica, no router", "worker_cached_tokens": [cached], "worker_prompt_tokens": [prompt],
            "worker_hit_rate": cached / max(1, prompt), **report}


def dp_policy(policy: str, workers: list[str], bench_args: list[str]) -> dict:
    port = free_port()
    router = subprocess.Popen(router_cmd(port, ["--worker-urls", *workers, "--policy", policy]))
    try:
        wait_ready(router, f"http://127.0.0.1:{port}")
        for w in workers:
            httpx.post(w + "/flush_cache", timeout=60)
        before = worker_stats(workers)
        report = bench_main(["--port", str(port), *bench_args])
        after = worker_stats(workers)
    finally:
        stop(router)
    cached, prompt = hit_counts(before, after)
    report.pop("config", None)
    return {"policy": policy, "worker_cached_tokens": cached, "worker_prompt_tokens": prompt,
            "worker_hit_rate": sum(cached) / max(1, sum(prompt)), "requests_per_worker_share":
            [p / max(1, sum(prompt)) for p in prompt], **report}


def run_dp(args: argparse.Namespace, argv: list[str]) -> dict:
    if args.model == "llama-3.1-8b":
        from benchmarks.lib.models import model_dir

        args.model = model_dir()
    flags = ["--model-path", args.model, "--device", args.device, "--dtype", args.dtype, "--max-total-tokens",
             str(args.max_total_tokens), "--load-format", args.load_format]
    bench_args = ["--backend", "radixlm", "--tokenizer", args.model, "--dataset-name", "generated-shared-prefix",
                  "--gsp-num-groups", str(args.num_groups), "--gsp-prompts-per-group", str(args.prompts_per_group),
                  "--gsp-system-prompt-len", str(args.system_prompt_len), "--gsp-question-len", str(args.question_len),
                  "--gsp-output-len", str(args.output_len), "--gsp-order", args.order,
                  "--max-concurrency", str(args.max_concurrency),
                  "--seed", str(args.seed), "--warmup-requests", "2", "--disable-tqdm"]
    procs, workers = start_workers(flags, args.worker_gpus)
    try:
        runs = [dp_policy(policy, workers, bench_args) for policy in ("cache_aware", "round_robin")]
        if args.single_replica:
            runs.append(dp_single(workers[0], bench_args))
    finally:
        stop_all(procs)
    ca, rr = runs[:2]
    result = {
        "benchmark": "router_dp", "workers": 2, "model": args.model, "device": args.device,
        "workload": {k: getattr(args, k) for k in ("num_groups", "prompts_per_group", "system_prompt_len",
                                                     "question_len", "output_len", "max_concurrency", "seed", "order")},
        "worker_max_total_tokens": args.max_total_tokens,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", SCRIPT, *argv]),
        "ratios_cache_aware_over_round_robin": {
            "request_throughput": ca["request_throughput"] / rr["request_throughput"],
            "output_throughput": ca["output_throughput"] / rr["output_throughput"],
            "worker_hit_rate": ca["worker_hit_rate"] / max(rr["worker_hit_rate"], 1e-9),
        },
        "ratios_cache_aware_over_one_replica": {
            "request_throughput": ca["request_throughput"] / runs[2]["request_throughput"],
            "output_throughput": ca["output_throughput"] / runs[2]["output_throughput"],
        } if args.single_replica else None,
        "worker_gpus": args.worker_gpus,
        "runs": runs,
    }
    print(f"{'policy':24} {'req/s':>7} {'out tok/s':>10} {'hit rate':>9} {'mean TTFT ms':>13}")
    for r in runs:
        print(f"{r['policy']:24} {r['request_throughput']:7.2f} {r['output_throughput']:10.1f} "
              f"{r['worker_hit_rate']:9.3f} {r['ttft_ms']['mean']:13.1f}")
    print(json.dumps(result["ratios_cache_aware_over_round_robin"], indent=1))
    print(json.dumps(result["ratios_cache_aware_over_one_replica"], indent=1))
    write(Path(args.out), result)
    return result


# ------------------------------------------------------------------------------------------------------ feedback
def feedback_args(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--num-groups", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--system-prompt-words", type=int, default=200)
    p.add_argument("--max-total-tokens", type=int, default=1536)
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--feedback-interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)


@dataclass(frozen=True)
class FeedbackRun:
    label: str
    router_flags: list[str]
    requests: int
    failed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    estimated_hit_rate: float  # router: tree-matched characters / input characters
    reported_hit_rate: float  # workers: cached / prompt tokens of the proxied responses
    abs_gap: float
    driver_reported_hit_rate: float  # the same, summed by this driver from the responses (a cross-check)
    workers_evicted_tokens: int
    corrections: dict


def feedback_run(label: str, flags: list[str], workers: list[str], prompts: list[str], args) -> FeedbackRun:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router = start(router_cmd(port, ["--worker-urls", *workers, "--policy", "cache_aware", *flags]), url)
    try:
        assert httpx.post(url + "/flush_cache", timeout=60).status_code == 200  # both runs start cold
        ev0 = evicted(workers)
        d = asyncio.run(drive(url, prompts, args.output_len, args.max_concurrency))
        fb = httpx.get(url + "/cache_feedback", timeout=30).json()
        ev = evicted(workers) - ev0
    finally:
        stop(router)
    est, rep = fb["estimated_cache_hit_rate"], fb["reported_cache_hit_rate"]
    corrections = {k: fb[k] for k in ("clears", "shrinks", "shrunk_chars", "phantom_drops", "phantom_chars",
                                      "polls", "poll_errors", "decisions", "tree_chars")}
    return FeedbackRun(label, flags, len(prompts), d.failed, round(d.seconds, 2), len(prompts) / d.seconds,
                       d.out / d.seconds, est, rep, abs(est - rep), d.cached / d.prompt if d.prompt else 0.0, ev,
                       corrections)


def run_feedback(args: argparse.Namespace, argv: list[str]) -> dict:
    prompts = feedback_workload(args.num_groups, args.rounds, args.system_prompt_words, args.seed)
    procs, workers = start_workers(["--max-total-tokens", str(args.max_total_tokens)], None)
    try:
        runs = [feedback_run("cache_aware", [], workers, prompts, args),
                feedback_run("cache_aware --cache-feedback",
                             ["--cache-feedback", "--cache-feedback-interval", str(args.feedback_interval)],
                             workers, prompts, args)]
    finally:
        stop_all(procs)
    result = {
        "benchmark": "router_feedback",
        "model": "default (SmolLM2-135M-Instruct)",
        "workload": {"dataset": "generated shared prefix (random words, rounds of shuffled groups)",
                     "num_groups": args.num_groups, "rounds": args.rounds, "requests": len(prompts),
                     "system_prompt_words": args.system_prompt_words, "output_len": args.output_len,
                     "max_concurrency": args.max_concurrency, "seed": args.seed,
                     "prefix_chars_total": sum(len(x.split("\n")[0]) for x in prompts[:args.num_groups])},
        "workers": {"count": 2, "max_total_tokens": args.max_total_tokens},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", SCRIPT, *argv]),
        "runs": [asdict(r) for r in runs],
    }
    print(f"\n{'run':32} {'est hit':>8} {'reported':>9} {'|gap|':>7} {'req/s':>7} {'out tok/s':>10} "
          f"{'evicted':>8} {'clears':>6} {'shrinks':>7} {'phantoms':>8}")
    for r in runs:
        c = r.corrections
        print(f"{r.label:32} {r.estimated_hit_rate:8.3f} {r.reported_hit_rate:9.3f} {r.abs_gap:7.3f} "
              f"{r.request_throughput:7.2f} {r.output_throughput:10.1f} {r.workers_evicted_tokens:8d} "
              f"{c['clears']:6d} {c['shrinks']:7d} {c['phantom_drops']:8d}")
    write(RESULTS / "router_feedback_cpu.json", result)
    return result


# ------------------------------------------------------------------------------------------------------------ pd
def pd_args(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--model-path", default="llama-3.1-8b",
                   help="llama-3.1-8b: the 8B architecture in benchmarks/models; tiny: its tiny-shaped copy (CPU smoke)")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-total-tokens", type=int, default=None, help="each server's KV pool (default: from memory)")
    p.add_argument("--gpus", nargs=2, default=["0", "1"], help="the two servers' --base-gpu-id (every GPU stays "
                   "visible to both, so the prefill server can write into the decode server's pool); 'none': no "
                   "flag (CPU)")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the prompts (default: the model's)")
    p.add_argument("--request-rate", type=float, nargs="+", default=[2.0],
                   help="one run per rate on the same servers (each with its own prompts: seed + its index)")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--input-len", type=int, default=8192, help="prompts are 0.5x-1x this long (4k-8k by default)")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--systems", nargs="+", choices=("pd", "colocated"), default=["pd", "colocated"],
                   help="run one of the two (the ratios need both)")
    p.add_argument("--out", default=str(RESULTS / "pd_vs_colocated.json"))


def pd_setup(label: str, pd: bool, model_flags: list[str], bench_args: list[list[str]],
             gpus: list[list[str]], on_report: Callable[[list[dict]], None] = lambda reports: None) -> list[dict]:
    """One report per entry of bench_args (a rate's run), all on the same servers; on_report gets those so far
    after each."""
    ports = [free_port(), free_port()]
    procs: list[subprocess.Popen] = []
    try:
        if pd:
            bootstrap = free_port()
            procs.append(start_server(ports[0], [*model_flags, *gpus[0], "--disaggregation-mode", "prefill",
                                                 "--disaggregation-bootstrap-port", str(bootstrap)]))
            procs.append(start_server(ports[1], [*model_flags, *gpus[1], "--disaggregation-mode", "decode"]))
            router_flags = ["--pd-disaggregation", "--prefill", f"http://127.0.0.1:{ports[0]}", str(bootstrap),
                            "--decode", f"http://127.0.0.1:{ports[1]}", "--prefill-policy", "cache_aware",
                            "--decode-policy", "power_of_two"]
        else:
            procs += [start_server(p, [*model_flags, *g]) for g, p in zip(gpus, ports)]
            router_flags = ["--worker-urls", *(f"http://127.0.0.1:{p}" for p in ports), "--policy", "cache_aware"]
        ready = [wait_ready(proc, f"http://127.0.0.1:{port}", PD_READY_TIMEOUT_S) for proc, port in zip(procs, ports)]
        router_port = free_port()
        procs.append(subprocess.Popen(router_cmd(router_port, router_flags)))
        wait_ready(procs[-1], f"http://127.0.0.1:{router_port}", 120)
        print(f"\n### {label}: workers ready in {max(ready):.1f} s", flush=True)
        reports = []
        for one in bench_args:
            report = bench_main(["--port", str(router_port), *one])
            report.pop("config", None)
            states = [httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=30).json()["internal_states"][0]
                      .get("disaggregation") for port in ports]  # cumulative over this setup's runs
            print(f"servers' disaggregation state: {states}", flush=True)
            reports.append({"system": label, "router_flags": router_flags, "disaggregation_states": states, **report})
            on_report(reports)
    finally:
        stop_all(procs)
    return reports


def run_pd(args: argparse.Namespace, argv: list[str]) -> dict:
    if args.model_path in ("llama-3.1-8b", "tiny"):
        from benchmarks.lib.models import model_dir, tiny_model_dir

        args.model_path = model_dir() if args.model_path == "llama-3.1-8b" else tiny_model_dir()
    model_flags = ["--model-path", args.model_path, "--load-format", args.load_format, "--dtype", args.dtype,
                   "--device", args.device]
    if args.max_total_tokens:
        model_flags += ["--max-total-tokens", str(args.max_total_tokens)]
    gpus = [[] if g == "none" else ["--base-gpu-id", g] for g in args.gpus]
    bench_args = [["--backend", "radixlm", "--tokenizer", args.tokenizer or args.model_path, "--dataset-name",
                   "random", "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
                   "--random-range-ratio", "0.5", "--num-prompts", str(args.num_prompts), "--request-rate", str(rate),
                   "--seed", str(args.seed + i), "--warmup-requests", "2", "--disable-tqdm"]
                  for i, rate in enumerate(args.request_rate)]
    none = [None] * len(bench_args)
    result = {
        "benchmark": "pd_vs_colocated",
        "model": args.model_path, "load_format": args.load_format,
        "workload": {"dataset": "random", "input_len": [args.input_len // 2, args.input_len],
                     "output_len": [args.output_len // 2, args.output_len], "num_prompts": args.num_prompts,
                     "seed": args.seed},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", SCRIPT, *argv]),
    }
    rates = args.request_rate
    pds, colos = list(none), list(none)

    def save(reports: list[dict], into: list) -> None:
        """After each run: a call cut short by its time limit keeps what it measured."""
        into[: len(reports)] = reports
        result["by_rate"] = [pd_rate(rate, pd, colo) for rate, pd, colo in zip(rates, pds, colos)]
        write(Path(args.out), result)

    if "pd" in args.systems:
        pd_setup("PD: 1 prefill GPU + 1 decode GPU", True, model_flags, bench_args, gpus, lambda r: save(r, pds))
    if "colocated" in args.systems:
        pd_setup("co-located: 2 replicas", False, model_flags, bench_args, gpus, lambda r: save(r, colos))
    for r in result.get("by_rate", []):
        print(f"\nrate {r['request_rate']}: {json.dumps(r['ratios_pd_over_colocated'], indent=2)}")
    return result


def pd_rate(rate: float, pd: dict | None, colo: dict | None) -> dict:
    """One rate's runs and PD's ratios to the co-located replicas."""
    return {
        "request_rate": rate,
        "ratios_pd_over_colocated": None if pd is None or colo is None else {
            "itl_p99": pd["itl_ms"]["p99"] / colo["itl_ms"]["p99"],
            "itl_median": pd["itl_ms"]["median"] / colo["itl_ms"]["median"],
            "ttft_median": pd["ttft_ms"]["median"] / colo["ttft_ms"]["median"],
            "output_throughput": pd["output_throughput"] / colo["output_throughput"],
        },
        "runs": [r for r in (pd, colo) if r is not None],
    }


def write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


KINDS = {Kind.DP: (dp_args, run_dp), Kind.FEEDBACK: (feedback_args, run_feedback), Kind.PD: (pd_args, run_pd)}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_kind(__doc__, {k: add for k, (add, _) in KINDS.items()}, None, argv)
    # SIGTERM (e.g. from `timeout`) becomes SystemExit, so `finally` stops the servers instead of orphaning them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return KINDS[args.kind][1](args, argv)


if __name__ == "__main__":
    main()
