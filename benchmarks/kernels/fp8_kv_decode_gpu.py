"""Decode with an FP8 KV cache against a bf16 one (issue 50: "FP8 KV at batch 64 with 8k-token contexts >= 1.4x the
bf16 KV decode step speed"), each next to its bytes floor at --bandwidth (H200: 4.8 TB/s), in one device call:

- kernel: the Triton decode attention of one layer (decode_attention, Llama-3.1-8B's heads: 32 query, 8 kv, 128
  dims) over --batch requests of --context tokens each, bf16 pool against float8 e4m3 (and e5m2) pools; the floor is
  the pool bytes it reads.
- step: a whole decode step of Llama-3.1-8B (dummy weights, bf16) through the ModelRunner (the CUDA-graph replay the
  server runs), --batch requests at --context tokens, KV pool bf16 against fp8_e4m3: the pool is filled directly
  (random values, no prefill), so the step is timed at the full context at once; the floor is the weights' bytes
  plus the KV bytes read.

    python benchmarks/kernels/fp8_kv_decode_gpu.py [--batch 64] [--context 8192] [--parts kernel,step] [--out DIR]
        [--variants all|NAME,...] [--profile-steps N]

--profile-steps N also runs N steps under torch.profiler and prints each pool's top kernels (device us a step).

--variants times stage 1's launch configs (decode_splits.DECODE_VARIANTS: "old", "wide" are the kernel before them,
narrow and wide) side by side, per case (pool dtype x pass width: --batch for narrow passes, decode_wide_rows for
wide ones), each checked against that old kernel's output ("x old": its speed against it; a float8 pool's variants
that widen to halves, KvWiden.F16 and F16_BITS, compute the dots in float16: the check holds them to the same
2e-2 of the output's largest value), and prints the fastest
per case next to the default (DECODE_DEFAULT_VARIANTS) with the dict to put in decode_splits.py. A model-dtype pool
only takes configs of its default's block size (same numerics).

Prints a table and writes fp8_kv_decode.json to --out (default $OUT, else the current directory), rewritten after
each row. No network: the 8B config and tokenizer are in benchmarks/models/. --dry runs tiny shapes on the CPU (the
step only; the kernel part needs CUDA or TRITON_INTERPRET=1)."""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 32
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def log(*a) -> None:
    print(*a, flush=True)


def time_ms(fn, device: str, reps: int) -> float:
    """Median of `reps` timed calls after warm-up (CUDA events; wall clock on the CPU)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def profile_kernels(fn, steps: int, top: int) -> list[dict]:
    """The top kernels of `steps` calls of fn by device microseconds a call (lib.profiling.profiled_kernels)."""
    from benchmarks.lib.profiling import profiled_kernels

    _, us, calls = profiled_kernels(lambda: [fn() for _ in range(steps)])
    ranked = sorted(us.items(), key=lambda kv: -kv[1])[:top]
    return [{"name": n[:100], "us": v / steps, "launches": calls[n] / steps} for n, v in ranked]


def fill_(buf: torch.Tensor, std: float = 1.0) -> None:
    """Random values in any pool dtype (drawn in bf16 chunks, cast on the copy)."""
    step = max(1, (1 << 28) // max(1, buf[0].numel()))
    for i in range(0, buf.shape[0], step):
        part = buf[i : i + step]
        part.copy_(torch.randn(part.shape, device=buf.device, dtype=torch.bfloat16) * std)


def kernel_rows(args, device: str, shapes: tuple[int, int, int]) -> list[dict]:
    """Each pool dtype at the default launch config."""
    from radixlm.runtime.kernels.attention import decode_attention

    heads, kv_heads, head_dim = shapes
    bs, ctx = args.batch, args.context
    slots = bs * ctx + 1
    req_to_token = (torch.arange(bs * ctx, device=device, dtype=torch.int64) + 1).view(bs, ctx)
    rows = torch.arange(bs, device=device)
    lens = torch.full((bs,), ctx, device=device, dtype=torch.int64)
    q = torch.randn(bs, heads, head_dim, device=device, dtype=torch.bfloat16)
    out, base = [], None
    for name in ["bf16"] + args.kv_dtypes:
        dtype = FP8.get(name, torch.bfloat16)
        k_buf = torch.empty(slots, kv_heads, head_dim, device=device, dtype=dtype)
        v_buf = torch.empty_like(k_buf)
        fill_(k_buf)
        fill_(v_buf)
        scale = 1.0 if name == "bf16" else 0.5
        ms = time_ms(lambda: decode_attention(q, k_buf, v_buf, req_to_token, rows, lens, head_dim**-0.5, ctx,
                                              k_scale=scale, v_scale=scale), device, args.reps)
        nbytes = 2 * k_buf.numel() * k_buf.element_size()
        floor = nbytes / args.bandwidth * 1e3
        base = base or ms
        out.append({"part": "kernel", "kv": name, "batch": bs, "context": ctx, "ms": ms, "floor_ms": floor,
                    "of_floor": floor / ms, "bytes": nbytes, "speedup_vs_bf16": base / ms})
        del k_buf, v_buf
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def variant_rows(args, device: str, shapes: tuple[int, int, int], save) -> dict:
    """Every --variants config per case (pool dtype, narrow or wide pass): a row each (saved as it goes), then the
    fastest valid one per case: {(KvPool, wide): (name, ms, kv)}."""
    from radixlm.runtime.kernels.attention import decode_attention, decode_wide_rows
    from radixlm.runtime.kernels.attention.decode_splits import (
        DECODE_DEFAULT_VARIANTS, DECODE_VARIANTS, KvPool, KvWiden, decode_kernel_config)

    heads, kv_heads, head_dim = shapes
    names = list(DECODE_VARIANTS) if args.variants == ["all"] else args.variants
    wide_bs = decode_wide_rows(kv_heads)
    # Each pool kind has its defaults; the wide pass is timed for bf16 and the first float8 dtype only.
    cases = [(args.batch, False, ["bf16"] + args.kv_dtypes[:1])]
    if not args.dry and "wide" in args.variant_widths:
        cases.append((max(wide_bs, args.batch), True, ["bf16"] + args.kv_dtypes[:1]))
    if args.kv_dtypes[1:]:
        cases.append((args.batch, False, args.kv_dtypes[1:]))
    best = {}
    for bs, wide, kvs in cases:
        if (bs >= wide_bs) != wide:
            log(f"variants: batch {bs} is not a {'wide' if wide else 'narrow'} pass at {kv_heads} kv heads: skipped")
            continue
        ctx = args.context
        req_to_token = (torch.arange(bs * ctx, device=device, dtype=torch.int64) + 1).view(bs, ctx)
        rows = torch.arange(bs, device=device)
        lens = torch.full((bs,), ctx, device=device, dtype=torch.int64)
        # --dry: halves (Triton's interpreter computes bfloat16 dots wrongly, so the check would flag every config)
        model_dtype = torch.float16 if args.dry else torch.bfloat16
        q = torch.randn(bs, heads, head_dim, device=device, dtype=model_dtype)
        for kv in kvs:
            float8 = kv != "bf16"
            dtype = FP8.get(kv, model_dtype)
            key = (KvPool.of(dtype), wide)
            default = DECODE_DEFAULT_VARIANTS[key]
            k_buf = torch.empty(bs * ctx + 1, kv_heads, head_dim, device=device, dtype=dtype)
            v_buf = torch.empty_like(k_buf)
            fill_(k_buf)
            fill_(v_buf)
            scale = 0.5 if float8 else 1.0
            nbytes = 2 * k_buf.numel() * k_buf.element_size()
            floor = nbytes / args.bandwidth * 1e3

            def call(config, splits=None):
                return decode_attention(q, k_buf, v_buf, req_to_token, rows, lens, head_dim**-0.5, ctx, splits,
                                        k_scale=scale, v_scale=scale, config=config, chunked=splits is None)

            baseline = "wide" if wide else "old"  # the kernel before the configs, in this case
            ref = call(DECODE_VARIANTS[baseline]).float()
            base_ms, timed = None, []

            def run(name, splits=None):
                nonlocal base_ms
                config = DECODE_VARIANTS[name]
                if time.perf_counter() - args.t0 > args.variant_budget_s:
                    log(f"variant budget of {args.variant_budget_s:.0f} s spent: no {name} {kv}")
                    return
                t0 = time.perf_counter()
                try:
                    err = ((call(config, splits).float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
                    ms = time_ms(lambda: call(config, splits), device, args.reps)
                except Exception as e:  # a config that does not build here: reported, not chosen
                    log(f"variant {name} {kv}: {type(e).__name__}: {str(e)[:200]}")
                    return
                ok = err < 2e-2
                base_ms = base_ms or ms
                if splits is None:
                    timed.append((ms, name, ok))
                save([{"part": "variant", "kv": kv, "variant": name + (f"@{splits}" if splits else ""),
                       "config": config.__dict__, "splits": splits, "wide": wide, "batch": bs, "context": ctx,
                       "ms": ms, "floor_ms": floor, "of_floor": floor / ms, "bytes": nbytes, "vs_old": base_ms / ms,
                       "baseline": baseline, "rel_err_vs_old": err, "valid": ok,
                       "default": name == default and splits is None,
                       "build_and_time_s": time.perf_counter() - t0}])

            for name in [baseline] + [n for n in names if n != baseline]:
                if not float8 and DECODE_VARIANTS[name].block_n != decode_kernel_config(KvPool.MODEL, wide).block_n:
                    continue  # other block sizes round differently: a model-dtype pool keeps its numerics
                if not float8 and (name == "cvt" or DECODE_VARIANTS[name].widen != KvWiden.QUERY):
                    continue  # "old" for a model-dtype pool, or its own config (no float8 to widen)
                run(name)
            # More programs than the split rule gives (decode_num_splits: one split here), for the two fastest:
            # information only (a default would need the rule to change), not for e5m2 (e4m3's kernels).
            if kv in ("bf16", args.kv_dtypes[0]):
                for _, name, _ in sorted(t for t in timed if t[2])[:2]:
                    for splits in args.variant_splits:
                        run(name, splits)
            valid = sorted(t for t in timed if t[2])
            if valid:
                ms, name, _ = valid[0]
                held = [t for t in valid if t[1] == default]
                if held and held[0][0] <= ms * (1 + args.variant_margin):  # within the noise: the default holds
                    ms, name = held[0][0], default
                best[key] = (name, ms, kv)
            del k_buf, v_buf
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    return best


def step_row(args, device: str, model_dir: str, kv: str, dtype: str) -> dict:
    from radixlm.runtime.args import ServerArgs
    from radixlm.runtime.executor.forward_batch import ModelWorkerBatch
    from radixlm.runtime.executor.logits import LogitsPlan
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.model_loader.config import ModelConfig

    bs, ctx = args.batch, args.context
    context_len = ctx + 16
    sargs = ServerArgs(model_path=model_dir, load_format="dummy", dtype=dtype, device=device, kv_cache_dtype=kv,
                       max_total_tokens=bs * ctx + 64, max_running_requests=bs, cuda_graph_max_bs=bs,
                       context_length=context_len, random_seed=0, disable_shared_prefix_decode=True)
    config = ModelConfig.from_path(model_dir, dtype=dtype, device=device, context_length=context_len,
                                   load_format="dummy")
    t0 = time.perf_counter()
    runner = ModelRunner(sargs, config, device)
    start_s = time.perf_counter() - t0
    pool = runner.token_to_kv_pool
    for buf in pool.k_buffer + pool.v_buffer:
        fill_(buf)
    # Request i holds slots [1 + i * ctx, 1 + (i + 1) * ctx): its first ctx - 1 tokens cached, the last one written
    # by the step (the same slot every step: the context stays at ctx).
    table = runner.req_to_token_pool.req_to_token
    table[:bs, :ctx] = (torch.arange(bs * ctx, device=table.device) + 1).view(bs, ctx)
    wb = ModelWorkerBatch(input_ids=[11] * bs, positions=[ctx - 1] * bs, req_pool_indices=list(range(bs)),
                          prefix_lens=[ctx - 1] * bs, extend_lens=[1] * bs, seq_lens=[ctx] * bs,
                          out_cache_loc=table[:bs, ctx - 1].clone(), logits=LogitsPlan(sample_rows=list(range(bs))))
    ms = time_ms(lambda: runner.forward(wb), device, args.reps)
    kernels = profile_kernels(lambda: runner.forward(wb), args.profile_steps, 16) if args.profile_steps else []
    model = runner.model
    embed = model.model.embed_tokens.weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) - embed.numel() * embed.element_size()
    kv_bytes = bs * ctx * runner.kv_bytes_per_token()
    row = {"part": "step", "kv": kv, "batch": bs, "context": ctx, "ms": ms, "graph": runner.graph_runner is not None,
           "floor_ms": (weights + kv_bytes) / args.bandwidth * 1e3, "weight_bytes": weights, "kv_bytes": kv_bytes,
           "kv_pool_tokens": runner.max_total_num_tokens, "start_s": start_s, "kernels": kernels}
    row["of_floor"] = row["floor_ms"] / ms
    runner.release_cuda_graphs()
    del runner, model, pool, table
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--parts", default="kernel,step")
    ap.add_argument("--kv-dtypes", default="fp8_e4m3,fp8_e5m2", help="kernel part: float8 pools against bf16")
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s of the floor (H200 HBM3e: 4.8 TB/s)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=180.0, help="each step's runner starts only within it")
    ap.add_argument("--variant-budget-s", type=float, default=120.0, help="--variants: no config starts after it")
    ap.add_argument("--variants", default="", help="kernel part: 'all' or names of decode_splits.DECODE_VARIANTS to "
                    "time side by side (default: none, the default configs only)")
    ap.add_argument("--step-at-tree-defaults", action="store_true", help="with --variants: the step part keeps "
                    "the tree's DECODE_DEFAULT_VARIANTS (default: it runs the ones --variants picked)")
    ap.add_argument("--variant-splits", default="2,4", help="--variants: split counts the two fastest configs of "
                    "each case are also timed at (information: the split rule, decode_num_splits, gives 1 here)")
    ap.add_argument("--variant-margin", type=float, default=0.02, help="--variants: the default holds unless a "
                    "config is faster by more than this share")
    ap.add_argument("--variant-widths", default="narrow,wide", help="--variants' cases: narrow (--batch), wide "
                    "(decode_wide_rows rows)")
    ap.add_argument("--profile-steps", type=int, default=0, help="step part: also profile this many steps and print "
                    "the top kernels' device time per step")
    ap.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (the script's own check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    args.kv_dtypes = [k for k in args.kv_dtypes.split(",") if k]
    args.variants = [v for v in args.variants.split(",") if v]
    args.variant_widths = set(args.variant_widths.split(","))
    args.variant_splits = [int(x) for x in args.variant_splits.split(",") if x]
    from radixlm.runtime.kernels.attention.decode_splits import DECODE_VARIANTS

    unknown = sorted(set(args.variants) - set(DECODE_VARIANTS) - {"all"})
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; choose 'all' or from {sorted(DECODE_VARIANTS)}")
    unknown = sorted(set(args.kv_dtypes) - set(FP8))
    if unknown:
        raise SystemExit(f"--kv-dtypes: unknown {unknown}; choose from {sorted(FP8)}")
    parts = set(args.parts.split(","))
    if parts - {"kernel", "step"}:
        raise SystemExit("--parts: kernel, step or both")
    t0 = args.t0 = time.perf_counter()
    device = "cpu" if args.dry else "cuda"
    if args.dry:
        args.batch, args.context, args.reps = min(args.batch, 4), min(args.context, 64), min(args.reps, 3)
    out_path = Path(args.out) / "fp8_kv_decode.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "fp8_kv_decode", "command": "python " + " ".join(sys.argv), "device": device,
              "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "torch": torch.__version__,
              "bandwidth": args.bandwidth, "rows": []}

    def save(rows: list[dict]) -> None:
        result["rows"] += rows
        out_path.write_text(json.dumps(result, indent=1))
        for r in rows:
            extra = (f"  {r['variant']:<11}{' (default)' if r['default'] else '':<10} {r['vs_old']:.2f}x old, "
                     f"err {r['rel_err_vs_old']:.1e}{'' if r['valid'] else ' WRONG'}" if r["part"] == "variant" else "")
            log(f"{r['part']:<7} {r['kv']:<9} bs {r['batch']:<4} ctx {r['context']:<6} {r['ms']:9.3f} ms  "
                f"floor {r['floor_ms']:8.3f} ms ({r['of_floor']:.2f} of it){extra}")

    if "kernel" in parts and (device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        shapes = (4, 2, 16) if args.dry else (HEADS, KV_HEADS, HEAD_DIM)
        save(kernel_rows(args, device, shapes))
        if args.variants:
            from radixlm.runtime.kernels.attention.decode_splits import DECODE_DEFAULT_VARIANTS, KvPool

            best = variant_rows(args, device, shapes, save)
            chosen = dict(DECODE_DEFAULT_VARIANTS)
            log("\nvariants: the fastest per case (pool, wide pass) against the default")
            for key, (name, ms, kv) in best.items():
                now = DECODE_DEFAULT_VARIANTS[key]
                verdict = "default holds" if name == now else f"set {name}"
                log(f"  {key[0].value:<6} {'wide' if key[1] else 'narrow':<7} ({kv}): fastest {name} {ms:.3f} ms; "
                    f"default {now}: {verdict}")
                chosen[key] = name
            result["variant_best"] = {f"{k[0].value},{'wide' if k[1] else 'narrow'}": v[0] for k, v in best.items()}
            first8 = (KvPool.of(FP8[args.kv_dtypes[0]]), False) if args.kv_dtypes else None
            if (KvPool.MODEL, False) in best and first8 in best:
                ratio = best[first8][1] / best[(KvPool.MODEL, False)][1]
                result["kernel_picked_fp8_over_bf16"] = ratio
                log(f"  picked: {best[first8][2]} {ratio:.2f}x bf16's time (issue 50: <= 0.71, 1.4x the speed)")
            log("decode_splits.DECODE_DEFAULT_VARIANTS = {" + ", ".join(
                f"(KvPool.{pool.name}, {wide}): {v!r}" for (pool, wide), v in chosen.items()) + "}")
            if "step" in parts and not args.step_at_tree_defaults:
                # The step part measures the picked defaults: this process only (the runner reads the dict per launch).
                DECODE_DEFAULT_VARIANTS.update(chosen)
                result["step_defaults"] = {f"{k[0].value},{'wide' if k[1] else 'narrow'}": v for k, v in chosen.items()}
                log("the step part runs these defaults")
    if "step" in parts:
        from benchmarks.lib.models import model_dir, tiny_model_dir

        d = tiny_model_dir() if args.dry else model_dir()
        dtype = "float32" if args.dry else "bfloat16"
        for kv in ("auto", "fp8_e4m3"):
            if time.perf_counter() - t0 > args.budget_s:
                log(f"budget of {args.budget_s:.0f} s spent: no {kv} step")
                break
            save([step_row(args, device, d, kv, dtype)])
    log("\n" + f"{'part':<7} {'kv':<9} {'ms':>9} {'floor ms':>9} {'of floor':>8} {'vs bf16':>7}")
    base = {}
    for r in result["rows"]:
        if r["part"] == "variant":
            continue
        base.setdefault(r["part"], r["ms"])
        log(f"{r['part']:<7} {r['kv']:<9} {r['ms']:9.3f} {r['floor_ms']:9.3f} {r['of_floor']:8.2f} "
            f"{base[r['part']] / r['ms']:7.2f}x")
    for r in result["rows"]:
        if r.get("kernels"):
            log(f"\nstep {r['kv']}: top kernels, device us per step (launches)")
            for k in r["kernels"]:
                log(f"  {k['us']:9.1f} ({k['launches']:5.1f})  {k['name']}")
    for part in ("kernel", "step"):
        rows = {r["kv"]: r for r in result["rows"] if r["part"] == part}
        ref = rows.get("bf16") or rows.get("auto")
        if ref and "fp8_e4m3" in rows:
            result[f"{part}_speedup_fp8_e4m3"] = ref["ms"] / rows["fp8_e4m3"]["ms"]
    out_path.write_text(json.dumps(result, indent=1))
    log(f"wrote {out_path} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
