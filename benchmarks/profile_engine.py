"""Where the time of an offline run goes (cProfile of the scheduler thread), for finding host-side overhead:

    python benchmarks/profile_engine.py --model default --device cuda --num-prompts 128 [--json-schema] --out prof.txt
    python benchmarks/profile_engine.py --llama8b-sharegpt --out prof.txt    # on a GPU: issue 20's ShareGPT-like

Runs one warm-up batch, then profiles `Engine.generate` over chat prompts (greedy, 64 new tokens, EOS ignored), or
over the side-by-side's ShareGPT-like workload on Llama-3.1-8B shapes (dummy bf16, the side-by-side's engine);
prints and writes the functions with the largest total and cumulative times."""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

from radixlm import Engine

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--json-schema", action="store_true")
    p.add_argument("--json-workload", action="store_true", help="json_decoding.py's prompts and schema")
    p.add_argument("--jump-forward", default="off", choices=["off", "fast", "exact"])
    p.add_argument("--llama8b-sharegpt", action="store_true", help="issue 20's ShareGPT-like on Llama-3.1-8B shapes")
    p.add_argument("--tiny", action="store_true", help="with --llama8b-sharegpt: a tiny random Llama on the CPU, "
                   "48 requests (a dry run)")
    p.add_argument("--lines", type=int, default=35, help="functions listed per table")
    p.add_argument("--out", default="profile.txt")
    args = p.parse_args()
    if args.llama8b_sharegpt:
        return profile(*llama8b_sharegpt(args.tiny), args)
    engine = Engine(args.model, device=args.device, dtype=args.dtype, max_running_requests=args.max_running,
                    max_total_tokens=65536, random_seed=0,
                    jump_forward=args.jump_forward)
    tok = engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe person number {i} as JSON."}],
                                       tokenize=False, add_generation_prompt=True) for i in range(args.num_prompts)]
    sp = {"temperature": 0, "max_new_tokens": 64}
    if args.json_workload:
        import json_decoding

        prompts = json_decoding.prompts_for(engine, json_decoding.passages(args.num_prompts, 0))
        sp = {"temperature": 0, "max_new_tokens": 256, "json_schema": json.dumps(json_decoding.SCHEMA)}
    elif args.json_schema:
        sp["json_schema"] = json.dumps(SCHEMA)
    else:
        sp["ignore_eos"] = True
    engine.generate(prompts[:4], sp)  # warm-up (and the grammar compiled)
    profile(engine, engine.builder.build(prompts, sp).msgs, args)


def llama8b_sharegpt(tiny: bool):
    """The side-by-side's engine and its ShareGPT-like requests (token ids), warmed up."""
    import random
    import sys
    from pathlib import Path

    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.gpu_llama8b import PEER_SIZES, greedy, make_engine
    from benchmarks.llama8b import model_dir
    from benchmarks.profile_workloads import tiny_model_dir
    from radixlm.bench.datasets import PromptSource, sharegpt_like_dataset

    if tiny:
        path = tiny_model_dir()
        engine = Engine(path, load_format="dummy", dtype="float32", device="cpu", context_length=4096, random_seed=0,
                        max_total_tokens=16384)
        n, max_in, max_out = 48, 96, 12
    else:
        path = model_dir()
        engine = make_engine(path)
        n, max_in, max_out = PEER_SIZES["sharegpt"]
    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    reqs = sharegpt_like_dataset(src, n, seed=1, max_input_len=max_in, max_output_len=max_out)
    engine.generate(input_ids=[r.input_ids for r in reqs[:8]], sampling_params=greedy(16))
    built = engine.builder.build(None, [greedy(r.output_len) for r in reqs], input_ids=[r.input_ids for r in reqs])
    return engine, built.msgs


def profile(engine, msgs, args) -> None:
    # cProfile sees one thread: stop the engine's scheduler thread and step its scheduler here instead.
    sched = engine.scheduler
    engine.shutdown()  # the scheduler object stays usable (its grammars are compiled and cached)
    stats0 = dict(sched.stats)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for m in msgs:
        sched.add_request(m)
    tokens = 0
    while not sched.is_idle():
        tokens += sum(len(o.new_output_ids) for o in sched.step())
    prof.disable()
    wall = time.perf_counter() - t0
    passes = sum(sched.stats[k] - stats0[k] for k in ("prefill_batches", "decode_batches"))
    buf = io.StringIO()
    buf.write(f"wall {wall:.2f} s, {passes} passes ({1000 * wall / max(passes, 1):.1f} ms/pass), {tokens} tokens\n")
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.lines)
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.lines)
    print(buf.getvalue())
    with open(args.out, "w") as f:
        f.write(buf.getvalue())


if __name__ == "__main__":
    main()
