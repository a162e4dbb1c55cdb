"""The JSON-decoding workload's host-side cost on the CPU, without the model: the engine runs as usual, but each
forward pass returns scripted logits (the next token of an earlier real run's output, one-hot) instead of running the
model. Outputs are the recorded ones in every mode (`off` replays them; `exact` drafts and verifies against them), so
what varies between modes and commits is the scheduler's own work. On a GPU that work, not the model, bounds a
small model's throughput (benchmarks/results/json_decoding_gpu_log.txt).

    python benchmarks/json_decoding.py --num-prompts 512 --max-running 32 --constraint regex --modes off \\
        --save-ids ids.json                                  # record (the real model, on the CPU)
    python benchmarks/host_overhead.py --ids ids.json --constraint regex [--modes off,exact] [--repeat 3]

Prints json_decoding's table and the phase timings (benchmarks/phases.py). Scripted logits cost a memset of
(rows, vocab) floats; the grammar's top-k and argmax over them run on the CPU too (on a GPU they are kernel
launches): those phases ("model forward", "grammar masks prepare", "sampler") are not host overhead here."""
from __future__ import annotations

import argparse
import json
import pstats
import sys
from pathlib import Path

import torch

import json_decoding
from phases import profile_steps
from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.executor.logits import LogitsOutput

HIGH = 10.0  # the scripted token's logit; every other token has 0


class ScriptedForward:
    """Stands in for ModelRunner.forward: each sampling row's logits pick the request's recorded next token, each
    draft-verification row the recorded token at its position."""

    def __init__(self, scheduler, scripts: dict[tuple[int, ...], list[int]], vocab_size: int, eos: int,
                 model_forward=None):
        """model_forward: the model's own pass, run first and its logits replaced (the device does a real pass's
        work; json_decoding.py --script-ids)."""
        self.scheduler, self.scripts, self.vocab_size, self.eos = scheduler, scripts, vocab_size, eos
        self.model_forward, self.device = model_forward, torch.device("cpu")

    def _token(self, req, index: int) -> int:
        script = self.scripts[tuple(req.origin_input_ids)]
        return script[index] if index < len(script) else self.eos

    def _logits(self, targets: list[int]) -> torch.Tensor:
        logits = torch.zeros(len(targets), self.vocab_size, device=self.device)
        # (indices staged without a sync: on a GPU the pass is still running)
        rows = host_to_device(list(range(len(targets))), torch.int64, self.device)
        logits[rows, host_to_device(targets, torch.int64, self.device)] = HIGH
        return logits

    def __call__(self, wb) -> LogitsOutput:
        mode = ForwardMode.REQUEST_SPANS
        if self.model_forward is not None:
            out = self.model_forward(wb)
            self.device, mode = out.next_token_logits.device, out.forward_mode
        batch = self.scheduler.launching  # the pass being launched: its samplers and verifiers, in row order
        sample = [self._token(r, r.num_output_tokens()) for r in batch.samplers]
        verify = [self._token(r, r.num_output_tokens() + j) for r in batch.verifiers for j in range(r.kv.draft_len() + 1)]
        return LogitsOutput(self._logits(sample), [], [], self._logits(verify) if verify else None, forward_mode=mode)


def scripted(ids_path: str, profiles: dict | None = None, mode: str = "", keep_model: bool = False):
    """A run_mode `prepare` replaying the outputs recorded in ids_path; keep_model: the model's passes still run."""
    recorded = json.loads(Path(ids_path).read_text())

    def prepare(engine, prompts, sp):
        msgs = engine.builder.build(prompts, sp).msgs
        if len(msgs) != len(recorded):
            raise SystemExit(f"{ids_path} holds {len(recorded)} outputs for {len(msgs)} prompts")
        scripts = {tuple(m.input_ids): ids for m, ids in zip(msgs, recorded)}
        eos = min(engine.model_config.eos_token_ids)
        engine.runner.forward = ScriptedForward(engine.scheduler, scripts, engine.vocab_size, eos,
                                                engine.runner.forward if keep_model else None)
        if profiles is not None:
            profiles[mode] = profile_steps(engine)

    return prepare


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
    texts = json_decoding.passages(n, 0)
    runs: dict[str, dict] = {}
    profiles: dict | None = {} if args.profile else None
    for _ in range(args.repeat):
        for mode in args.modes.split(","):
            r = json_decoding.run_mode(mode, ns, texts, prepare=scripted(args.ids, profiles, mode))
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
