"""The JSON-decoding workload's host-side cost on the CPU, without the model: the engine runs as usual, but each
forward pass returns scripted logits (the next token of an earlier real run's output, one-hot) instead of running the
model. Outputs are the recorded ones in every mode (`off` replays them; `exact` drafts and verifies against them), so
what varies between modes and commits is the scheduler's own work. On a GPU that work, not the model, bounds a
small model's throughput (benchmarks/results/grammar/json_decoding_gpu_log.txt).

    python benchmarks/grammar/json_decoding.py --num-prompts 512 --max-running 32 --constraint regex --modes off \\
        --save-ids ids.json                                  # record (the real model, on the CPU)
    python benchmarks/grammar/host_overhead.py --ids ids.json --constraint regex [--modes off,exact] [--repeat 3]

Prints json_decoding's table and the phase timings (benchmarks/lib/phases.py). Scripted logits cost a memset of
(rows, vocab) floats; the grammar's top-k and argmax over them run on the CPU too (on a GPU they are kernel
launches): those phases ("model forward", "grammar masks prepare", "sampler") are not host overhead here."""
from __future__ import annotations

import argparse
import json
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib import json_workload  # noqa: E402
from benchmarks.lib.json_workload import scripted  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ids", required=True, help="output ids recorded by json_decoding.py --save-ids")
    p.add_argument("--constraint", choices=["json_schema", "regex"], default="regex")
    p.add_argument("--model", default="default")
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--modes", default="off,exact")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--profile", type=int, default=0, help="also print the N functions of most own time (cProfile)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    n = len(json.loads(Path(args.ids).read_text()))
    ns = argparse.Namespace(model=args.model, constraint=args.constraint, max_running=args.max_running,
                            device="cpu", dtype="float32", max_total_tokens=131072, phases=True)  # as on the GPU
    texts = json_workload.passages(n, 0)
    runs: dict[str, dict] = {}
    profiles: dict | None = {} if args.profile else None
    for _ in range(args.repeat):
        for mode in args.modes.split(","):
            r = json_workload.run_mode(mode, ns, texts, prepare=scripted(args.ids, profiles, mode))
            if mode not in runs or r["wall_s"] < runs[mode]["wall_s"]:
                runs[mode] = r
    base = next(iter(runs.values()))
    print(f"{'mode':8} {'wall s':>7} {'tok/s':>8} {'passes':>7} {'vs first':>8} {'same':>5}")
    for mode, r in runs.items():
        same = sum(a == b for a, b in zip(r["_ids"], base["_ids"]))
        print(f"{mode:8} {r['wall_s']:7.2f} {r['output_tokens_per_s']:8.0f} {r['forward_passes']:7d} "
              f"{base['wall_s'] / r['wall_s']:8.2f} {same:5d}")
    for mode, r in runs.items():
        print(f"phases of {mode} ({r['wall_s']:.2f} s):\n" + r["_timer"].table(r["wall_s"], r["forward_passes"],
                                                                                r["output_tokens"]))
    for mode, prof in (profiles or {}).items():
        print(f"cProfile of {mode} (warm-up included):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        if args.out:
            prof.dump_stats(f"{args.out}.{mode}.prof")
    if args.out:
        keep = {m: {k: v for k, v in r.items() if not k.startswith("_")} for m, r in runs.items()}
        Path(args.out).write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "runs": keep}, indent=2))


if __name__ == "__main__":
    main()
