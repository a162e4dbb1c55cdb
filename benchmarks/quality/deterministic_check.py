"""--enable-deterministic-inference on the GPU: Llama-3.1-8B shapes, bf16, dummy weights (the benchmarks' 8B
directory). Two parts (--parts):

  check       one 600-token prompt generated alone, then inside batches of 8, 64 and 256 with other prompts (other
              lengths, fresh for every batch), each batch once after a cache flush (no prefix hit for it: the
              co-requests share none of its tokens) and once after 400 of its tokens were cached (a prefix hit; a
              third of the co-requests also start with a part of it), every prompt prefilled in chunks of
              --chunked-prefill-size; its output tokens and their logprobs compared exactly with the alone run's.
              With --baseline, the same cases on an engine without the flag (what the flag changes).
  throughput  the ShareGPT-like workload (1000 requests, benchmarks/lib: sharegpt_like_dataset) with the flag off
              and on, same engine settings otherwise: output and total tokens/s and the cost of the flag.
  memory      issue 55 item 2, not deterministic mode: an engine with --enable-memory-saver (flag off) generates,
              releases its memory (release_memory_occupation: KV cache and weights), resumes and generates again;
              GPU memory (torch.cuda.mem_get_info, the allocator, nvidia-smi's per-process figure) before, while
              released and after, beside this process's bare CUDA context measured before the engine started (aim:
              released <= 1 GiB above it), the largest CUDA tensors still alive while released, and whether the
              outputs (tokens and logprobs) after the resume equal those before.

    python benchmarks/quality/deterministic_check.py --parts check throughput --baseline --out $OUT/determinism.json

--model tiny runs the same on the CPU with tiny shapes (a dry run of the script: --device cpu)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import close, log, offline_run  # noqa: E402
from benchmarks.lib.models import model_dir, tiny_model_dir  # noqa: E402
from radixlm import Engine  # noqa: E402
from radixlm.bench.datasets import PromptSource, random_dataset, sharegpt_like_dataset  # noqa: E402


@dataclass(frozen=True)
class Lengths:
    target: int = 600  # the checked prompt
    cached: int = 400  # its tokens cached before a prefix-hit case
    co_max: int = 1500  # the co-requests' longest prompt


def make(path: str, device: str, deterministic: bool, **kw) -> Engine:
    kw.setdefault("mem_fraction_static", 0.85 if device == "cuda" else None)
    return Engine(path, load_format="dummy", dtype="bfloat16", device=device, context_length=4096, random_seed=0,
                  enable_deterministic_inference=deterministic, **{k: v for k, v in kw.items() if v is not None})


def co_requests(src: PromptSource, rng: random.Random, target: list[int], n: int, share: bool,
                lengths: Lengths) -> list[list[int]]:
    """n prompts of 16..co_max tokens; with share, every third starts with a part of target (10 to all but 10)."""
    out = []
    for i in range(n):
        ids = src.ids(rng.randint(16, lengths.co_max))
        if share and i % 3 == 0:
            ids = target[: rng.randint(10, lengths.target - 10)] + ids[:200]
        out.append(ids)
    return out


def target_run(engine: Engine, target: list[int], others: list[list[int]], at: int, n_out: int) -> dict:
    batch = others[:at] + [target] + others[at:]
    params = {"temperature": 0, "max_new_tokens": n_out, "ignore_eos": True}
    outs = engine.generate(input_ids=batch, sampling_params=params, return_logprob=True)
    meta = outs[at]["meta_info"]
    return {"ids": outs[at]["output_ids"], "logprobs": [lp for lp, *_ in meta["output_token_logprobs"]],
            "cached_tokens": meta["cached_tokens"]}


def compare(case: str, run: dict, ref: dict) -> dict:
    same_ids = run["ids"] == ref["ids"]
    same_lp = run["logprobs"] == ref["logprobs"]
    first = next((i for i, (a, b) in enumerate(zip(run["ids"], ref["ids"])) if a != b), None)
    n = len(run["ids"]) if first is None else first  # logprobs compare where both saw the same tokens
    delta = max((abs(a - b) for a, b in zip(run["logprobs"][:n], ref["logprobs"][:n])), default=0.0)
    log(f"  {case:34} cached {run['cached_tokens']:4d}: tokens {'same' if same_ids else f'differ at {first}'}, "
        f"logprobs {'identical' if same_lp else f'max |delta| {delta:.3g}'}")
    return {"case": case, "cached_tokens": run["cached_tokens"], "tokens_identical": same_ids,
            "logprobs_identical": same_lp, "first_token_difference": first, "max_abs_logprob_delta": delta}


def part_check(path: str, device: str, deterministic: bool, batches: list[int], n_out: int, chunk: int,
               lengths: Lengths) -> dict:
    from transformers import AutoTokenizer

    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    target = src.ids(lengths.target)
    rng = random.Random(1)
    engine = make(path, device, deterministic, chunked_prefill_size=chunk, max_running_requests=max(batches) + 1)
    try:
        target_run(engine, src.ids(64), [src.ids(200) for _ in range(7)], 0, 4)  # warm-up
        engine.flush_cache()
        ref = target_run(engine, target, [], 0, n_out)
        rows = []
        for b in batches:
            engine.flush_cache()
            rows.append(compare(f"batch {b}, no prefix hit",
                                target_run(engine, target, co_requests(src, rng, target, b - 1, False, lengths),
                                           b // 2, n_out), ref))
            engine.flush_cache()
            engine.generate(input_ids=target[: lengths.cached], sampling_params={"temperature": 0, "max_new_tokens": 1})
            rows.append(compare(f"batch {b}, {lengths.cached} tokens cached",
                                target_run(engine, target, co_requests(src, rng, target, b - 1, True, lengths),
                                           b // 3, n_out), ref))
    finally:
        close(engine)
    return {"deterministic": deterministic, "lengths": vars(lengths), "output_tokens": n_out,
            "chunked_prefill_size": chunk, "cases": rows,
            "all_identical": all(r["tokens_identical"] and r["logprobs_identical"] for r in rows)}


def part_throughput(path: str, device: str, n: int) -> dict:
    from transformers import AutoTokenizer

    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    result = {}
    for deterministic in (False, True):
        engine = make(path, device, deterministic)
        try:
            offline_run(engine, random_dataset(src, 64, 128, 16, 1.0), "warm-up", mfu=False)
            name = f"sharegpt-like, deterministic {'on' if deterministic else 'off'}"
            result["on" if deterministic else "off"] = offline_run(engine, sharegpt_like_dataset(src, n, seed=1),
                                                                    name, mfu=False)
        finally:
            close(engine)
    off, on = result["off"]["output_tokens_per_s"], result["on"]["output_tokens_per_s"]
    result["cost"] = 1 - on / off
    log(f"deterministic mode: {on:.0f} vs {off:.0f} output tok/s ({result['cost']:.1%} slower; aim <= 20%)")
    return result


def gpu_memory(tag: str) -> dict:
    """This device's memory now: mem_get_info's used bytes, the allocator's, nvidia-smi's figure for this process
    (None where its PID namespace hides it) and every process nvidia-smi lists; the state's name alone off CUDA."""
    import subprocess

    import torch

    if not torch.cuda.is_available():
        return {"state": tag}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    procs = []
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        procs = [{"pid": int(a), "mib": float(b)} for a, b in (ln.split(",") for ln in out.strip().splitlines() if ln)]
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        log(f"  nvidia-smi: {e}")
    mine = next((p["mib"] for p in procs if p["pid"] == os.getpid()), None)
    row = {"state": tag, "used_gib": (total - free) / 2**30, "allocated_gib": torch.cuda.memory_allocated() / 2**30,
           "reserved_gib": torch.cuda.memory_reserved() / 2**30, "nvidia_smi_process_mib": mine,
           "nvidia_smi_processes": procs}
    log(f"  {tag:9}: used {row['used_gib']:7.3f} GiB (allocated {row['allocated_gib']:.3f}, reserved "
        f"{row['reserved_gib']:.3f}; nvidia-smi, this process: {mine} MiB)")
    return row


def live_cuda_tensors(top: int = 10) -> list[dict]:
    """The largest CUDA tensors still referenced (by shape and dtype), with their count: what holds memory while
    released."""
    import gc
    from collections import Counter

    import torch

    sizes: Counter = Counter()
    counts: Counter = Counter()
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                key = f"{tuple(obj.shape)} {str(obj.dtype).removeprefix('torch.')}"
                sizes[key] += obj.untyped_storage().nbytes()
                counts[key] += 1
        except Exception:  # noqa: BLE001 - objects that fail isinstance or have no storage
            continue
    return [{"tensor": k, "count": counts[k], "mib": v / 2**20} for k, v in sizes.most_common(top)]


def timed_call(call) -> float:
    """Seconds an Engine memory call took; it must have been accepted."""
    t0 = time.perf_counter()
    ok, msg = call()
    if not ok:
        raise RuntimeError(f"{call.__name__} refused: {msg}")
    return time.perf_counter() - t0


def part_memory(path: str, device: str, n_out: int = 16) -> dict:
    """Issue 55 item 2 (the module docstring's `memory`)."""
    from transformers import AutoTokenizer

    import torch

    cuda = device == "cuda"
    if cuda:
        torch.zeros(1, device="cuda")  # this process's CUDA context (and the allocator's first block): the reference
    context = gpu_memory("context")
    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(2))
    prompts = [src.ids(random.Random(i).randint(100, 900)) for i in range(16)]
    params = {"temperature": 0, "max_new_tokens": n_out, "ignore_eos": True}

    def run() -> list[tuple]:
        outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        return [(o["output_ids"], [lp for lp, *_ in o["meta_info"]["output_token_logprobs"]]) for o in outs]

    engine = make(path, device, False, enable_memory_saver=True)
    rows = [context]
    try:
        before = run()
        rows.append(gpu_memory("before"))
        release_s = timed_call(engine.release_memory_occupation)
        rows.append(gpu_memory("released"))
        alive = live_cuda_tensors() if cuda else []
        resume_s = timed_call(engine.resume_memory_occupation)
        rows.append(gpu_memory("resumed"))
        after = run()
    finally:
        close(engine)
    above = rows[2]["used_gib"] - context["used_gib"] if cuda else 0.0
    smi = [r.get("nvidia_smi_process_mib") for r in (context, rows[2])]
    result = {"snapshots": rows, "released_above_context_gib": above, "aim_gib": 1.0,
              "within_aim": above <= 1.0 if cuda else None,
              "released_above_context_nvidia_smi_mib": smi[1] - smi[0] if None not in smi else None,
              "alive_while_released": alive, "release_s": release_s, "resume_s": resume_s,
              "outputs_identical_after_resume": before == after, "prompts": len(prompts), "output_tokens": n_out}
    aim = {True: "met", False: "NOT met", None: "no GPU"}[result["within_aim"]]
    log(f"memory: released {above:.3f} GiB above the CUDA context (aim <= 1 GiB: {aim}); release {release_s:.1f} s, "
        f"resume {resume_s:.1f} s; "
        f"outputs after resume {'identical' if before == after else 'DIFFER'}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=("check", "throughput", "memory"), default=["check", "throughput"])
    p.add_argument("--model", choices=("8b", "tiny"), default="8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=int, nargs="+", default=[8, 64, 256])
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--chunked-prefill-size", type=int, default=2048)
    p.add_argument("--baseline", action="store_true", help="the check's cases without the flag too")
    p.add_argument("--lengths", type=int, nargs=3, default=[600, 400, 1500], metavar=("TARGET", "CACHED", "CO_MAX"),
                   help="the checked prompt's tokens, those cached before a prefix-hit case, the co-requests' most")
    p.add_argument("--sharegpt-n", type=int, default=1000)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "determinism.json"))
    a = p.parse_args()
    path = model_dir() if a.model == "8b" else tiny_model_dir()
    result: dict = {"model": f"Llama-3.1-8B shapes ({a.model}), bf16, dummy weights", "host": platform.node(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if a.device == "cuda":
        import torch

        result["device"] = torch.cuda.get_device_name()
    try:
        if "check" in a.parts:
            log("deterministic mode on:")
            lengths = Lengths(*a.lengths)
            if not 10 < lengths.cached < lengths.target - 10 or lengths.co_max < 16:
                p.error("--lengths: 10 < CACHED < TARGET - 10 and CO_MAX >= 16")
            result["check"] = part_check(path, a.device, True, a.batches, a.max_new_tokens, a.chunked_prefill_size,
                                         lengths)
            if a.baseline:
                log("deterministic mode off (baseline):")
                result["check_baseline"] = part_check(path, a.device, False, a.batches, a.max_new_tokens,
                                                      a.chunked_prefill_size, lengths)
        if "throughput" in a.parts:
            result["throughput"] = part_throughput(path, a.device, a.sharegpt_n)
        if "memory" in a.parts:
            result["memory"] = part_memory(path, a.device)
    finally:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2))
        log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
