"""STANDALONE on an 8B model's passes without its weights (speculative/speculative.py --script-ids): a target with
Llama-3.1-8B's shapes and a draft model with Llama-3.2-1B's (the same vocabulary), both with dummy weights and the
recording model's tokenizer, run every pass for real; the target's logits are replaced by a recorded run's tokens
(a small model's greedy outputs, as grammar/json_decoding.py --script-ids does), and each draft token is the recorded
one with probability --draft-acceptance (else another token), so acceptance is set, not learned: random weights would
reject every draft. Outputs are the recording in every mode. --tiny: the same with tiny shapes, on the CPU.

Recording models (RECORDINGS): SmolLM2-135M-Instruct (`default`, vocabulary 49,152) and Qwen2.5-Coder-0.5B-Instruct
(vocabulary 151,936: it performs the `edit` workload's rename, which SmolLM2 leaves out). Either way the shapes
are Llama-3.1-8B's and Llama-3.2-1B's with the recording model's vocabulary, tokenizer and stop tokens:

    python -m benchmarks.lib.speculative_replay qwen2.5-coder-0.5b-instruct /tmp/qt8b [/tmp/qd1b]  # no draft: target
"""
from __future__ import annotations

import json
import random
from enum import Enum
from pathlib import Path

import torch

from benchmarks.lib.models import shaped_like_8b
from radixlm.runtime.executor.logits import LogitsOutput
from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.model_loader.tokenizer import get_tokenizer
from radixlm.runtime.spec.sources.model import DraftModelSource

HIGH = 10.0  # a replayed token's logit; every other token has 0
# recording model (alias) -> its recorded greedy outputs (speculative.py --save-ids on the CPU)
RESULTS = Path(__file__).resolve().parents[1] / "results" / "speculative"
RECORDINGS = {"default": RESULTS / "speculative_smol_ids_cpu.json",
              "qwen2.5-coder-0.5b-instruct": RESULTS / "speculative_qwen_coder_ids_cpu.json"}


class ModelShape(Enum):
    """Overrides of Llama-3.1-8B's config (benchmarks/models/llama-3.1-8b)."""

    LLAMA_3_1_8B = "llama-3.1-8b"
    LLAMA_3_2_1B = "llama-3.2-1b"  # the draft: Llama 3's vocabulary
    TINY = "tiny"
    TINY_DRAFT = "tiny-draft"

    @property
    def overrides(self) -> dict:
        return {
            ModelShape.LLAMA_3_1_8B: {},
            ModelShape.LLAMA_3_2_1B: {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                                      "tie_word_embeddings": True},
            ModelShape.TINY: {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
            ModelShape.TINY_DRAFT: {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16},
        }[self]


def shaped(tokenizer_model: str, dst: str, shape: ModelShape) -> str:
    """A model directory of `shape` (dummy weights) with tokenizer_model's tokenizer, vocabulary and stop tokens."""
    out = shaped_like_8b(tokenizer_model, dst)
    config_path = Path(out) / "config.json"
    config = json.loads(config_path.read_text())
    config.update(shape.overrides)
    config_path.write_text(json.dumps(config, indent=2))
    # A replayed token must be a row of the target's logits, and a tokenizer token a row of its embedding.
    n_tokens = len(get_tokenizer(out))
    if n_tokens > config["vocab_size"]:
        raise ValueError(f"{tokenizer_model}: {n_tokens} tokenizer tokens > vocab_size {config['vocab_size']}")
    return out


class ReplayForward:
    """Stands in for the target's ModelRunner.forward: the pass runs, then each sampling row's logits pick the
    request's recorded next token and each verification row the recorded token at its position."""

    def __init__(self, scheduler, scripts: dict[tuple[int, ...], list[int]], vocab_size: int, eos: int,
                 model_forward):
        self.scheduler, self.scripts, self.vocab_size, self.eos = scheduler, scripts, vocab_size, eos
        self.model_forward = model_forward

    def token(self, req, index: int) -> int:
        script = self.scripts[tuple(req.origin_input_ids)]
        return script[index] if index < len(script) else self.eos

    def _logits(self, targets: list[int], device: torch.device) -> torch.Tensor:
        logits = torch.zeros(len(targets), self.vocab_size, device=device)
        rows = host_to_device(list(range(len(targets))), torch.int64, device)
        logits[rows, host_to_device(targets, torch.int64, device)] = HIGH
        return logits

    def __call__(self, wb) -> LogitsOutput:
        out = self.model_forward(wb)
        device = out.next_token_logits.device
        batch = self.scheduler.launching  # the pass being launched: its samplers and verifiers, in row order
        # A row yields the token after it: the next one to sample (counting tokens in flight), then the draft's.
        sample = [self.token(r, r.num_output_tokens()) for r in batch.samplers]
        verify = [self.token(r, r.num_output_tokens() + j) for r in batch.verifiers
                  for j in range(r.kv.draft_len() + 1)]
        return LogitsOutput(self._logits(sample, device), out.input_logprobs, out.input_top,
                            self._logits(verify, device) if verify else None, forward_mode=out.forward_mode,
                            req_pool_indices=out.req_pool_indices)


def install(engine, prompts: list[str], recorded: list[list[int]], acceptance: float, seed: int = 0) -> None:
    """Replays `recorded` (the outputs of `prompts`, greedy) on the engine's target; a draft model's chain tokens
    become the recorded ones with probability `acceptance` each (its passes still run)."""
    sp = {"temperature": 0, "max_new_tokens": 1}
    msgs = engine.builder.build(prompts, sp).msgs
    scripts = {tuple(m.input_ids): ids for m, ids in zip(msgs, recorded)}
    eos = min(engine.model_config.eos_token_ids)
    replay = ReplayForward(engine.scheduler, scripts, engine.vocab_size, eos, engine.runner.forward)
    engine.runner.forward = replay
    rng = random.Random(seed)
    for source in engine.scheduler.drafts.sources:
        if isinstance(source, DraftModelSource):
            chains = source._chains

            def scripted(todo, steps, chains=chains):
                got, probs = chains(todo, steps)
                # Chain token j stands at output index len(output_ids) + j (the first guesses a token in flight).
                wanted = [[replay.token(r, len(r.output_ids) + j) for j in range(len(c))] for r, c in zip(todo, got)]
                return [[t if rng.random() < acceptance else (t + 1) % engine.vocab_size for t in w]
                        for w in wanted], probs

            source._chains = scripted


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description="writes the target (8B shapes) and draft (1B shapes) model directories")
    p.add_argument("tokenizer_model",
                   help="the recording model (alias, GGUF or directory): its tokenizer and vocabulary")
    p.add_argument("target_dir")
    p.add_argument("draft_dir", nargs="?", help="none: the target only (NGRAM and RADIX need no draft model)")
    p.add_argument("--tiny", action="store_true", help="tiny target and draft shapes instead (a CPU dry run)")
    args = p.parse_args()
    target, draft = ((ModelShape.TINY, ModelShape.TINY_DRAFT) if args.tiny
                     else (ModelShape.LLAMA_3_1_8B, ModelShape.LLAMA_3_2_1B))
    print(shaped(args.tokenizer_model, args.target_dir, target),
          shaped(args.tokenizer_model, args.draft_dir, draft) if args.draft_dir else "")


if __name__ == "__main__":
    main()
