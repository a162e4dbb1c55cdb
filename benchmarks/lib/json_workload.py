"""The paper's JSON-decoding workload (extract a city's fields from a passage into a JSON schema or a regex), one
engine per jump-forward mode (run_mode), and scripted logits: each forward pass returns the next token of a recorded
run's output instead of the model's (scripted), so every mode and every tree decodes the same tokens
(grammar/json_decoding.py)."""
from __future__ import annotations

import gc
import json
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.lib.phases import PhaseTimer, profile_steps
from radixlm import Engine
from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.executor.logits import LogitsOutput
from radixlm.runtime.host_to_device import host_to_device

CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Turin", "Accra", "Dakar"]
COUNTRIES = ["France", "Japan", "Nigeria", "Peru", "Norway", "Egypt", "Ecuador", "Vietnam", "Australia", "Italy",
             "Ghana", "Senegal"]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "latitude": {"type": "number", "minimum": -90, "maximum": 90},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "top 3 landmarks": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 3, "maxItems": 3},
        "is_capital": {"type": "boolean"},
    },
    "required": ["name", "country", "latitude", "population", "top 3 landmarks", "is_capital"],
}
# The paper's Figure-style regex for the same fields (fixed key order and spacing).
STR = r'"[\w\d\s]{1,20}"'
REGEX = (r'\{\n  "name": ' + STR + r',\n  "country": ' + STR + r',\n  "latitude": -?\d{1,2}\.\d{1,4},\n'
         r'  "population": \d{1,9},\n  "top 3 landmarks": \[' + STR + ", " + STR + ", " + STR + r'\],\n'
         r'  "is_capital": (true|false)\n\}')


def passages(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        j = rng.randrange(len(CITIES))
        out.append(f"{CITIES[j]} is a city in {COUNTRIES[j]} with about {rng.randrange(10**5, 10**7)} inhabitants. "
                   f"It lies at latitude {rng.uniform(-60, 60):.2f}. Visitors like its old market, its river and "
                   f"its museum of {rng.choice(['art', 'history', 'science'])}. (record {i})")
    return out


def prompts_for(engine: Engine, texts: list[str]) -> list[str]:
    # As in the paper's program: the passage, then a line naming the fields to extract.
    tok = engine.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": "Please extract the information of a city from the "
                                      f"following passage.\nPassage begin.\n{t}\nPassage end.\nHere are the "
                                      "name, country, latitude, population, top 3 landmarks and is_capital of the "
                                      "city in JSON format."}], tokenize=False, add_generation_prompt=True)
            for t in texts]


def run_mode(mode: str, args, texts: list[str], prepare=None) -> dict:
    """prepare(engine, prompts, sampling_params), when given, runs before the warm-up; args.script_ids: recorded
    outputs replayed (json_decoding.py --script-ids; args.skip_model: without the model's passes)."""
    if prepare is None and getattr(args, "script_ids", None):
        prepare = scripted(args.script_ids, keep_model=not getattr(args, "skip_model", False))
    jump_forward, *opts = mode.split(":")
    engine = Engine(args.model, jump_forward=jump_forward, grammar_mask="always" if "always" in opts else "on_demand",
                    mixed_chunk="off" if "nomix" in opts else "auto", random_seed=0, device=args.device, dtype=args.dtype,
                    max_running_requests=args.max_running, max_total_tokens=args.max_total_tokens,
                    load_format=getattr(args, "load_format", "auto"))
    try:
        prompts = prompts_for(engine, texts)
        sp = {"temperature": 0, "max_new_tokens": 256}
        sp["json_schema" if args.constraint == "json_schema" else "regex"] = (
            json.dumps(SCHEMA) if args.constraint == "json_schema" else REGEX)
        if prepare is not None:
            prepare(engine, prompts, sp)
        engine.generate(prompts[: args.max_running], sp)  # warm-up: grammar compiled, kernels of every batch size built
        stats0 = dict(engine.scheduler.stats)
        masks0 = engine.scheduler.grammar_stats["masks_filled"]
        timer = PhaseTimer.attach(engine) if args.phases else None
        prof = profile_steps(engine) if getattr(args, "profile", 0) else None
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sp)
        wall = time.perf_counter() - t0
        if timer is not None:
            timer.detach()
        sched = engine.scheduler
        out_tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
        c = sched.grammar_stats
        return {
            "mode": mode, "wall_s": wall, "output_tokens": out_tokens, "output_tokens_per_s": out_tokens / wall,
            "requests_per_s": len(outs) / wall,
            "mean_latency_s": statistics.mean(o["meta_info"]["e2e_latency"] for o in outs),
            "forward_passes": sum(sched.stats[k] - stats0[k] for k in ("prefill_batches", "decode_batches")),
            "finished_by_stop": sum(o["meta_info"]["finish_reason"]["type"] == "stop" for o in outs),
            "masks_filled_per_token": (c["masks_filled"] - masks0) / out_tokens,
            "exact_draft_tokens": c["draft_tokens"], "exact_accepted_tokens": c["accepted_draft_tokens"],
            "exact_acceptance_rate": c["accepted_draft_tokens"] / c["draft_tokens"] if c["draft_tokens"] else None,
            "learned_drafts": c["learned_drafts"], "distinct_lessons": c["distinct_lessons"],
            "fast_forced_tokens": c["forced_tokens"], "jump_passes": sched.stats["jump_decode_batches"] - stats0["jump_decode_batches"],
            "_ids": [o["output_ids"] for o in outs], "_texts": [o["text"] for o in outs],
            "phases": timer.as_dict() if timer is not None else None, "_timer": timer, "_profile": prof,
        }
    finally:
        engine.shutdown()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next mode's engine sizes its KV pool from free memory


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
