"""python -m radixlm.bench.programs: the paper's LM programs against a server, with its ablations.

    # against a running radixlm server
    python -m radixlm.bench.programs --base-url http://127.0.0.1:30000 --num-programs 32
    # start `radixlm serve` for the run (one server per distinct server configuration), every ablation
    python -m radixlm.bench.programs --launch-server --model-path default --ablations --scale 0.1 \\
        --num-programs 4 --output-file benchmarks/results/programs/programs_cpu.json
    # any OpenAI-compatible completions endpoint (regex workloads are skipped)
    python -m radixlm.bench.programs --backend openai --base-url http://host:8000/v1 --model NAME --tokenizer PATH

Few-shot workloads finish in milliseconds at 16 programs: give them more with
--num-programs-per-workload mmlu=128,hellaswag=128. Each variant warms every workload up first (--warm-up-programs,
unmeasured), so that one-off server costs do not land in whichever variant runs first.
--repeat N measures each variant x workload N times (the same programs, the cache flushed before each) and reports
medians; --repeat-max-seconds S repeats only the workloads whose first run took under S s (short runs are the noisy
ones; long sequential runs stay single).

Single-variant switches: --disable-radix-cache, --schedule-policy (server; need --launch-server),
--no-frontend-parallelism, --no-fork-hint (client), --all-off (all of them).

--merge joins the results of several runs (the variants of one table split across device calls, each a --variants
subset with the same workloads, program counts, --scale and seed) into one JSON, with its markdown table and PNG:
    python -m radixlm.bench.programs --merge P1.json P2.json --output-file programs_gpu.json [--note "..."]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from typing import Any, Optional

from radixlm.bench import procs
from radixlm.bench.programs import report
from radixlm.bench.programs.runner import (ALL_OFF_SERVER, VARIANTS, WARM_UP_SEED_OFFSET, BackendSpec, RunOptions,
                                           Variant, run_variant, warm_up)
from radixlm.bench.programs.workloads import WORKLOADS


ENV_KEYS = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="all", help=f"comma-separated, from: {', '.join(WORKLOADS)}")
    p.add_argument("--num-programs", type=int, default=16, help="program instances per workload")
    p.add_argument("--num-programs-per-workload", default="",
                   help="overrides --num-programs for the named workloads, e.g. mmlu=128,hellaswag=128")
    p.add_argument("--warm-up-programs", type=int, default=4,
                   help="before each variant's measured run of a workload, up to this many programs of it run "
                        "unmeasured (other prompts; 0: none)")
    p.add_argument("--repeat", type=int, default=1,
                   help="measured runs per variant and workload (each flushed unless --no-flush, the same programs); "
                        "the figures reported are their medians, every run's programs/s and duration kept")
    p.add_argument("--repeat-max-seconds", type=float, default=None,
                   help="with --repeat: repeat a workload only where its first run took less than this (one run "
                        "otherwise), so that only short, noisy runs pay for the repeats")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every input length and output budget")
    p.add_argument("--num-threads", type=int, default=64, help="run_batch threads (programs in flight)")
    p.add_argument("--backend", choices=["runtime", "openai"], default="runtime")
    p.add_argument("--base-url", default=None, help="server URL (OpenAI: up to /v1)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--launch-server", action="store_true", help="start `radixlm serve` for the run (runtime backend)")
    p.add_argument("--model-path", default="default", help="the launched server's model")
    p.add_argument("--server-args", default="", help="more arguments for the launched server, one string")
    p.add_argument("--server-timeout", type=float, default=procs.READY_TIMEOUT_S)
    p.add_argument("--model", default="default", help="model name sent to an OpenAI endpoint")
    p.add_argument("--api-key", default=None)
    p.add_argument("--tokenizer", default=None, help="tokenizer for the optimal hit rate (default: the server's)")
    p.add_argument("--no-optimal", action="store_true", help="skip the optimal hit rate (no tokenizer needed)")
    p.add_argument("--no-flush", action="store_true", help="do not flush the server's cache before each workload")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--schedule-policy", default=None, help="passed to the launched server (lpm, fcfs, random ...)")
    p.add_argument("--no-frontend-parallelism", action="store_true",
                   help="one program at a time, forks run sequentially")
    p.add_argument("--no-fork-hint", action="store_true",
                   help="no frontend prefix hints (fork's shared-prefix prefill, run_batch's prefix cache)")
    p.add_argument("--all-off", action="store_true", help="every optimization off (the baseline)")
    p.add_argument("--ablations", action="store_true", help="run every variant: " + ", ".join(v.name for v in VARIANTS))
    p.add_argument("--variants", default=None, help="with --ablations: a comma-separated subset")
    p.add_argument("--output-file", default=None, help="JSON path; the markdown (and PNG) go next to it")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="merge these runs' results into --output-file instead of running (missing files skipped)")
    p.add_argument("--note", action="append", default=[], help="with --merge: a note for the merged table")
    return p.parse_args(argv)


def single_variant(args: argparse.Namespace) -> Variant:
    if args.all_off:
        return Variant("all_off", ALL_OFF_SERVER, parallel=False, hints=False)
    server: list[str] = []
    if args.disable_radix_cache:
        server.append("--disable-radix-cache")
    if args.schedule_policy:
        server += ["--schedule-policy", args.schedule_policy]
    parts = [x for x, on in (("no_radix_cache", args.disable_radix_cache),
                             (f"{args.schedule_policy}", bool(args.schedule_policy)),
                             ("no_frontend_parallelism", args.no_frontend_parallelism),
                             ("no_frontend_hint", args.no_fork_hint)) if on]
    return Variant("+".join(parts) or "full", tuple(server), not args.no_frontend_parallelism, not args.no_fork_hint)


def chosen_variants(args: argparse.Namespace) -> list[Variant]:
    if not args.ablations:
        return [single_variant(args)]
    if args.variants:
        names = args.variants.split(",")
        unknown = sorted(set(names) - {v.name for v in VARIANTS})
        if unknown:
            raise SystemExit(f"unknown variants {unknown}")
        return [v for v in VARIANTS if v.name in names]
    return list(VARIANTS)


def parse_counts(text: str) -> dict[str, int]:
    """'mmlu=128,hellaswag=64' -> {"mmlu": 128, "hellaswag": 64}; SystemExit on anything else."""
    counts: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not value.strip().lstrip("-").isdigit():
            raise SystemExit(f"--num-programs-per-workload: {item!r} is not WORKLOAD=COUNT")
        if name not in WORKLOADS:
            raise SystemExit(f"--num-programs-per-workload: unknown workload {name!r}; choose from {list(WORKLOADS)}")
        if name in counts:
            raise SystemExit(f"--num-programs-per-workload: {name!r} given twice")
        if int(value) <= 0:
            raise SystemExit(f"--num-programs-per-workload: {name}={value.strip()}: the count must be positive")
        counts[name] = int(value)
    return counts


def load_tokenizer(args: argparse.Namespace, base_url: str) -> Any:
    if args.no_optimal:
        return None
    from radixlm.bench.serving import load_tokenizer as load

    name = args.tokenizer or (None if args.backend == "runtime" else args.model)
    return load(name, base_url if args.backend == "runtime" else "http://invalid")


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if args.merge:
        return merge_files(args.merge, args.output_file, args.note)
    names = list(WORKLOADS) if args.workloads == "all" else args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    workloads = [WORKLOADS[n] for n in names]
    counts = parse_counts(args.num_programs_per_workload)
    if args.num_programs <= 0:
        raise SystemExit("--num-programs must be positive")
    if args.warm_up_programs < 0:
        raise SystemExit("--warm-up-programs must be 0 or more")
    if args.repeat < 1:
        raise SystemExit("--repeat must be 1 or more")
    if args.repeat_max_seconds is not None and args.repeat_max_seconds <= 0:
        raise SystemExit("--repeat-max-seconds must be positive")
    variants = chosen_variants(args)
    if args.launch_server and args.backend != "runtime":
        raise SystemExit("--launch-server starts a radixlm server: use it with --backend runtime")
    opt = RunOptions(args.num_programs, args.seed, args.scale, args.num_threads, flush=not args.no_flush,
                     counts=counts, warm_up=args.warm_up_programs, repeat=args.repeat,
                     repeat_max_seconds=args.repeat_max_seconds)
    spec_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    results: dict[str, dict] = {}
    proc, running_args = None, None
    try:
        for v in variants:
            if args.launch_server:
                want = v.server_args + tuple(shlex.split(args.server_args))
                if proc is None or want != running_args:
                    if proc is not None:
                        procs.stop(proc)
                    port = procs.free_port()
                    spec_url = f"http://127.0.0.1:{port}"
                    cmd = [sys.executable, "-m", "radixlm.launch_server", "--model-path", args.model_path,
                           "--port", str(port), *want]
                    print("starting:", " ".join(cmd), flush=True)
                    proc, running_args = procs.start(cmd, spec_url, args.server_timeout), want
                    warm_up(spec_url)
            elif v.server_args and args.backend == "runtime":
                print(f"[{v.name}] skipped: it changes the server's arguments ({' '.join(v.server_args)}); "
                      "use --launch-server", flush=True)
                results[v.name] = {w.name: {"skipped": "needs --launch-server"} for w in workloads}
                continue
            if opt.tokenizer is None and not args.no_optimal:
                opt.tokenizer = load_tokenizer(args, spec_url)
            spec = BackendSpec(args.backend, spec_url, args.model, args.api_key)
            results[v.name] = run_variant(workloads, spec, v, opt, log=lambda m: print(m, flush=True))
            if args.output_file:  # what is measured so far survives a run killed before its end
                report.write(summary(args, argv, names, opt, variants, results), args.output_file)
    finally:
        if proc is not None:
            procs.stop(proc)
    out = summary(args, argv, names, opt, variants, results)
    print(report.markdown(out))
    for kind, path in report.write(out, args.output_file).items():
        print(f"wrote {kind}: {path}")
    return out


def summary(args: argparse.Namespace, argv: Optional[list[str]], names: list[str], opt: RunOptions,
            variants: list[Variant], results: dict[str, dict]) -> dict:
    return {"config": {"command": shlex.join(["python", "-m", "radixlm.bench.programs",
                                             *(argv if argv is not None else sys.argv[1:])]),
                      "backend": args.backend, "model": args.model_path if args.launch_server else args.model,
                      "num_programs": args.num_programs, "seed": args.seed, "scale": args.scale,
                      "num_threads": args.num_threads, "workloads": names,
                      "num_programs_per_workload": {n: opt.programs_for(n) for n in names},
                      "flush": opt.flush,
                      "warm_up": {"max_programs": opt.warm_up, "seed": opt.seed + WARM_UP_SEED_OFFSET,
                                  "parallel": True, "measured": False,
                                  "when": "before every variant's measured run of every workload"},
                      "repeat": repeat_config(opt),
                      "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
                      "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                               "load_avg_at_end": list(os.getloadavg())},
                      "variants": {v.name: {"server_args": list(v.server_args), "parallel": v.parallel,
                                            "hints": v.hints} for v in variants}},
           "variants": results}


def repeat_config(opt: RunOptions) -> dict:
    if opt.repeat == 1:
        rule = "one measured run per variant and workload"
    elif opt.repeat_max_seconds is None:
        rule = f"{opt.repeat} measured runs per variant and workload"
    else:
        rule = (f"{opt.repeat} measured runs where a variant's first run of a workload took under "
                f"{opt.repeat_max_seconds:g} s, one run otherwise")
    return {"runs": opt.repeat, "max_seconds": opt.repeat_max_seconds, "stat": "median", "rule": rule,
            "flushed_before_each": opt.flush}



SAME = ("backend", "model", "num_programs", "num_programs_per_workload", "seed", "scale", "workloads", "repeat")


def merge(runs: list[dict], notes: Optional[list[str]] = None) -> dict:
    """One table from runs of the same workloads and sizes (else SystemExit), variants in the paper's order."""
    first = runs[0]["config"]
    for r in runs[1:]:
        diff = [k for k in SAME if r["config"].get(k) != first.get(k)]
        if diff:
            raise SystemExit(f"runs differ in {diff}: not one table")
    variants: dict[str, dict] = {}
    for r in runs:
        variants.update(r["variants"])
    order = [v.name for v in VARIANTS]  # the paper's order, all_off last (the baseline column)
    variants = dict(sorted(variants.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    config = dict(first)
    config["command"] = " ; ".join(r["config"]["command"] for r in runs)
    config["variants"] = {k: v for r in runs for k, v in r["config"].get("variants", {}).items()}
    config["hosts"] = [r["config"].get("host") for r in runs]
    config["notes"] = [n for r in runs for n in r["config"].get("notes", [])] + list(notes or [])
    return {"config": config, "variants": variants}


def merge_files(paths: list[str], output_file: Optional[str], notes: list[str]) -> dict:
    if not output_file:
        raise SystemExit("--merge writes --output-file: give one")
    runs = []
    for path in paths:
        if os.path.isfile(path):
            with open(path) as f:
                runs.append(json.load(f))
        else:
            print(f"warning: {path} missing, merged without it", file=sys.stderr)
    if not runs:
        raise SystemExit("nothing to merge")
    out = merge(runs, notes)
    for kind, path in report.write(out, output_file).items():
        print(f"wrote {kind}: {path}")
    return out


if __name__ == "__main__":
    main()
