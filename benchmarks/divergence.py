"""Where a mode's greedy output left `off`'s (json_decoding.py keeps the first few differences in its JSON): the
model's raw top logprobs at that position, computed for the common prefix in a pass of its own, so a near-tie (two
tokens within rounding of each other) shows as such.

    python benchmarks/divergence.py --result benchmarks/results/json_decoding_gpu_json_schema_float32.json \\
        --model MODEL --device cuda --dtype float32 [--mode exact] [--out FILE]"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from radixlm import Engine

import json_decoding


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--result", required=True, help="a json_decoding.py result JSON")
    p.add_argument("--model", required=True)
    p.add_argument("--mode", default="exact")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    result = json.loads(Path(args.result).read_text())
    diffs = result["runs"][args.mode].get("differs_from_off", [])
    texts = json_decoding.passages(result["num_prompts"], args.seed)
    engine = Engine(args.model, device=args.device, dtype=args.dtype, random_seed=0)
    report = []
    try:
        prompts = json_decoding.prompts_for(engine, texts)
        for d in diffs:
            prompt_ids = engine.tokenizer.encode(prompts[d["request"]], add_special_tokens=False)
            common = d["base_ids"][: d["at"]]
            out = engine.generate(input_ids=prompt_ids + common, return_logprob=True, top_logprobs_num=5,
                                  sampling_params={"temperature": 0, "max_new_tokens": 1})
            top = out["meta_info"]["output_top_logprobs"][0]
            chosen = {"off": d["base_ids"][d["at"]] if d["at"] < len(d["base_ids"]) else None,
                      args.mode: d["ids"][d["at"]] if d["at"] < len(d["ids"]) else None}
            entry = {"request": d["request"], "at": d["at"], "chosen": chosen,
                     "chosen_text": {k: engine.tokenizer.decode([v]) if v is not None else None
                                     for k, v in chosen.items()},
                     "top_logprobs": [[lp, tok, engine.tokenizer.decode([tok])] for lp, tok, _ in top]}
            report.append(entry)
            print(json.dumps(entry))
    finally:
        engine.shutdown()
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "differences": report},
                                             indent=2) + "\n")


if __name__ == "__main__":
    main()
