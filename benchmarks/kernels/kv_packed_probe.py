"""Does decode attention read the KV pool faster when one program takes several kv heads of a request? (issue 50's
FP8 KV target; issue 56's batch-32 step.)

Stage 1 of decode attention (kernels/attention/decode.py) runs one program per (kv head, request): a float8 pool's
program reads 128 bytes of each slot's 1 KB row (Llama-3.1-8B: 8 kv heads of 128 dims), bf16's 256. A program that
takes HP neighbouring kv heads reads HP times that, contiguous, and puts its GQA group's padding rows to use: the
HP groups' query rows (4 each here) share one 16-row operand, each row's query laid in its own kv head's columns and
zero elsewhere, so Q' @ K'^T gives every row its own head's scores and P @ V' its own head's output (read back on
the block diagonal). The tensor-core work per head is the same as one program per kv head.

Two parts, Llama-3.1-8B heads (32 query, 8 kv, 128 dims), --batch requests of --context positions (contiguous slots):
- gather: the pool reads alone (K and V tiles of HP heads summed, no attention) per HP, block and split count;
- attention: the packed stage 1 (+ decode.py's stage 2 where split) against decode_attention's default launch, the
  output checked against it, per pool dtype (bf16, fp8_e4m3) and HP.

- layout (--part layout): decode_attention itself, at its variants (decode_splits.DECODE_VARIANTS), over a slot-major
  pool (slots, kv heads, dims), as the runtime's, and over a head-major one (kv heads, slots, dims; passed as a
  permuted view, the kernel takes any strides): one kv head's rows of consecutive slots then lie together.

- short (--part short): decode_attention at its variants over a bf16 pool at the decode batches of the side-by-side
  (16, 32, 64 requests of --context positions, e.g. 640), one and two splits, timed in CUDA-graph replays over four
  pool copies (eager timing at these sizes is the launch's host time).

    python benchmarks/kernels/kv_packed_probe.py [--batch 64] [--context 8192] [--part packed|layout|short] [--out DIR]

Prints each row and writes kv_packed_probe.json to --out (default $OUT), rewritten after each row."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from radixlm.runtime.kernels.attention.span import _block  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


@triton.jit
def _gather_probe(K_buf, V_buf, Table, Out, ctx, stride_kbs, stride_rt, num_splits, W: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    pack = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    per = tl.cdiv(ctx, num_splits)
    start = split * per
    end = tl.minimum(start + per, ctx)
    offs_c = tl.arange(0, W)
    acc = tl.zeros([W], dtype=tl.int32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(Table + b * stride_rt + offs_n, mask=n_mask, other=0)
        ptr = slots[:, None] * stride_kbs + pack * W + offs_c[None, :]
        k = tl.load(K_buf + ptr, mask=n_mask[:, None], other=0)
        v = tl.load(V_buf + ptr, mask=n_mask[:, None], other=0)
        acc += tl.sum(k.to(tl.int32) + v.to(tl.int32), 0)
    tl.store(Out + ((b * tl.num_programs(0) + pack) * num_splits + split) * W + offs_c, acc)


@triton.jit
def _packed_stage1(Q, K_buf, V_buf, Table, Seq_lens, Mid_o, Mid_lse, O, sm_scale, stride_qb, stride_qh, stride_kbs,
                   stride_rt, stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh,
                   num_splits, GROUP: tl.constexpr, HP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_N: tl.constexpr, KV_CVT: tl.constexpr, Q_F16: tl.constexpr, DIRECT: tl.constexpr):
    pack = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(Seq_lens + b)
    per = tl.cdiv(seq_len, num_splits)
    start = split * per
    end = tl.minimum(start + per, seq_len)
    W: tl.constexpr = HP * HEAD_DIM
    offs_r = tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, W)
    r_mask = offs_r < HP * GROUP
    diag = ((offs_c[None, :] // HEAD_DIM) == (offs_r[:, None] // GROUP)) & r_mask[:, None]
    heads = pack * HP * GROUP + offs_r
    dim = offs_c % HEAD_DIM
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + dim[None, :], mask=diag, other=0.0)
    if Q_F16:
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    table = Table + b * stride_rt
    col0 = pack * W
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, W], dtype=tl.float32)
    offs_n = start + tl.arange(0, BLOCK_N)
    n_mask = offs_n < end
    slots = tl.load(table + offs_n, mask=n_mask, other=0)
    for n0 in range(start, end, BLOCK_N):
        ptr = slots[:, None] * stride_kbs + col0 + offs_c[None, :]
        k = tl.load(K_buf + ptr, mask=n_mask[:, None], other=0.0)
        v = tl.load(V_buf + ptr, mask=n_mask[:, None], other=0.0)
        next_n = n0 + BLOCK_N + tl.arange(0, BLOCK_N)
        next_mask = next_n < end
        next_slots = tl.load(table + next_n, mask=next_mask, other=0)
        m_i, l_i, acc = _block(q, k, v, n_mask, m_i, l_i, acc, sm_scale, "tf32", KV_CVT)
        slots, n_mask = next_slots, next_mask
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(end > start, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    if DIRECT:
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + dim[None, :], out.to(O.dtype.element_ty), mask=diag)
    else:
        tl.store(Mid_o + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos + dim[None, :], out,
                 mask=diag)
        tl.store(Mid_lse + b * stride_mlb + heads * stride_mlh + split, lse, mask=r_mask)


def packed_attention(q, k_buf, v_buf, table, seq_lens, sm_scale, hp, splits, block_n, warps, stages, kv_cvt, q_f16):
    from radixlm.runtime.kernels.attention.decode import _decode_stage2

    bs, heads, dim = q.shape
    group = heads // k_buf.shape[1]
    out = torch.empty_like(q)
    direct = splits == 1
    if direct:
        mid_o, mid_lse, strides = out, out, (0, 0, 0, 0, 0)
    else:
        mid_o = torch.empty(bs, heads, splits, dim, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(bs, heads, splits, dtype=torch.float32, device=q.device)
        strides = (mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1))
    _packed_stage1[(k_buf.shape[1] // hp, bs, splits)](
        q, k_buf, v_buf, table, seq_lens, mid_o, mid_lse, out, sm_scale, q.stride(0), q.stride(1), k_buf.stride(0),
        table.stride(0), *strides, out.stride(0), out.stride(1), splits, GROUP=group, HP=hp, HEAD_DIM=dim,
        BLOCK_R=max(16, triton.next_power_of_2(hp * group)), BLOCK_N=block_n, KV_CVT=kv_cvt, Q_F16=q_f16,
        DIRECT=direct, num_warps=warps, num_stages=stages)
    if not direct:
        _decode_stage2[(bs, heads)](mid_o, mid_lse, out, None, *strides, out.stride(0), out.stride(1), splits,
                                    HEAD_DIM=dim, BLOCK_D=dim, BLOCK_S=triton.next_power_of_2(splits),
                                    CHUNKED=False, BLOCK_B=32, num_warps=4)
    return out


def requests(bs: int, ctx: int, dev: str) -> tuple[torch.Tensor, ...]:
    """bs requests of ctx positions on consecutive slots (slot 0 unused): req_to_token, lengths, pool rows, queries."""
    table = (torch.arange(bs * ctx, device=dev, dtype=torch.int64) + 1).view(bs, ctx)
    lens = torch.full((bs,), ctx, device=dev, dtype=torch.int64)
    q = torch.randn(bs, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    return table, lens, torch.arange(bs, device=dev), q


def time_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=40)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--bandwidth", type=float, default=4.8e12)
    p.add_argument("--part", choices=("packed", "layout", "short"), default="packed")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    if args.part == "layout":
        return layout_part(args)
    if args.part == "short":
        return short_part(args)
    from radixlm.runtime.kernels.attention import decode_attention
    from radixlm.runtime.kernels.attention.decode_splits import KvWiden
    from radixlm.runtime.kernels.attention.span import kv_convert_asm

    dev = "cuda"
    bs, ctx = args.batch, args.context
    table, lens, rows_idx, q = requests(bs, ctx, dev)
    result = {"benchmark": "kv_packed_probe", "gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
              "batch": bs, "context": ctx, "rows": []}
    path = Path(args.out) / "kv_packed_probe.json"

    def save(row):
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        path.write_text(json.dumps(result, indent=1))

    for name, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("bf16", torch.bfloat16)):
        k_buf = torch.empty(bs * ctx + 1, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
        v_buf = torch.empty_like(k_buf)
        for buf in (k_buf, v_buf):
            for i in range(0, buf.shape[0], 1 << 20):
                buf[i:i + (1 << 20)].copy_(torch.randn(buf[i:i + (1 << 20)].shape, device=dev) * 0.5)
        nbytes = 2 * k_buf.numel() * k_buf.element_size()
        floor = nbytes / args.bandwidth * 1e3
        raw = torch.int8 if dtype.itemsize == 1 else torch.int16
        kr, vr = k_buf.view(raw), v_buf.view(raw)
        for hp in (1, 2, 4, 8):
            for block_n in (64, 128):
                for splits in sorted({1, max(1, 512 // (bs * KV_HEADS // hp)), max(1, 1024 // (bs * KV_HEADS // hp))}):
                    for stages in (2,):
                        w = hp * HEAD_DIM
                        out = torch.empty(bs * (KV_HEADS // hp) * splits * w, dtype=torch.int32, device=dev)
                        if block_n * w * dtype.itemsize > 65536:
                            continue
                        warps = 8 if block_n * w * dtype.itemsize > 16384 else 4
                        ms = time_ms(lambda: _gather_probe[(KV_HEADS // hp, bs, splits)](
                            kr, vr, table, out, ctx, k_buf.stride(0), table.stride(0), splits, W=w, BLOCK_N=block_n,
                            num_warps=warps, num_stages=stages))
                        save({"part": "gather", "kv": name, "hp": hp, "block_n": block_n, "splits": splits,
                              "stages": stages, "warps": warps, "ms": ms, "floor_ms": floor, "of_floor": floor / ms})
        scale = head_scale = HEAD_DIM ** -0.5
        ref_ms = time_ms(lambda: decode_attention(q, k_buf, v_buf, table, rows_idx, lens, head_scale, ctx))
        want = decode_attention(q, k_buf, v_buf, table, rows_idx, lens, head_scale, ctx).float()
        save({"part": "attention", "kv": name, "kernel": "decode_attention default", "ms": ref_ms, "floor_ms": floor,
              "of_floor": floor / ref_ms})
        fp8 = dtype.itemsize == 1
        kv_cvt = kv_convert_asm(dtype, q.dtype, q.device, KvWiden.F16 if fp8 else None)
        for hp in (1, 2, 4):
            for block_n in (32, 64, 128) if hp == 4 else (64, 128):
                for warps in (4, 8):
                    for stages in (1, 2):
                        programs = bs * KV_HEADS // hp
                        for splits in sorted({1, max(1, 512 // programs), max(1, 1024 // programs)}):
                            if block_n * hp * HEAD_DIM * dtype.itemsize > 32768:
                                continue
                            def call():
                                return packed_attention(q, k_buf, v_buf, table, lens, scale, hp, splits, block_n,
                                                        warps, stages, kv_cvt, fp8)
                            try:
                                got = call().float()
                                err = ((got - want).abs().max() / want.abs().max()).item()
                                ms = time_ms(call)
                            except Exception as e:  # noqa: BLE001 - a config the compiler refuses (shared memory)
                                save({"part": "attention", "kv": name, "hp": hp, "block_n": block_n, "warps": warps,
                                      "stages": stages, "splits": splits, "error": str(e)[:200]})
                                continue
                            save({"part": "attention", "kv": name, "hp": hp, "block_n": block_n, "warps": warps,
                                  "stages": stages, "splits": splits, "ms": ms, "rel_err": err, "floor_ms": floor,
                                  "of_floor": floor / ms, "x_default": ref_ms / ms})
        del k_buf, v_buf, kr, vr
        torch.cuda.empty_cache()
    best = {}
    for r in result["rows"]:
        if "ms" in r and r.get("rel_err", 0) < 2e-2:
            key = (r["part"], r["kv"], r.get("hp"))
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    for key, r in sorted(best.items(), key=lambda kv: str(kv[0])):
        print("best", key, json.dumps(r))


def layout_part(args) -> None:
    from radixlm.runtime.kernels.attention import decode_attention
    from radixlm.runtime.kernels.attention.decode_splits import DECODE_VARIANTS, decode_kernel_config

    dev = "cuda"
    bs, ctx = args.batch, args.context
    table, lens, rows_idx, q = requests(bs, ctx, dev)
    result = {"benchmark": "kv_packed_probe layout", "gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
              "batch": bs, "context": ctx, "rows": []}
    path = Path(args.out) / "kv_layout_probe.json"
    names = ["old", "s3", "n128p1r128", "n128p1r128h", "n128p1r128b", "p1h", "s3h", "n128s3", "wide", "n128w8p1h"]
    for name, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("bf16", torch.bfloat16)):
        fp8 = dtype.itemsize == 1
        default = decode_kernel_config(fp8, False)
        for layout in ("slot_major", "head_major"):
            shape = (bs * ctx + 1, KV_HEADS, HEAD_DIM) if layout == "slot_major" else (KV_HEADS, bs * ctx + 1, HEAD_DIM)
            bufs = []
            for _ in range(2):
                buf = torch.empty(shape, device=dev, dtype=dtype)
                flat = buf.view(-1, HEAD_DIM)
                for i in range(0, flat.shape[0], 1 << 20):
                    flat[i:i + (1 << 20)].copy_(torch.randn(flat[i:i + (1 << 20)].shape, device=dev) * 0.5)
                bufs.append(buf if layout == "slot_major" else buf.permute(1, 0, 2))
            k_buf, v_buf = bufs
            floor = 2 * k_buf.numel() * k_buf.element_size() / args.bandwidth * 1e3
            want = decode_attention(q, k_buf, v_buf, table, rows_idx, lens, HEAD_DIM ** -0.5, ctx).float()
            for var in names:
                cfg = DECODE_VARIANTS[var]
                if not fp8 and cfg.widen.value != "query":
                    continue

                def call():
                    return decode_attention(q, k_buf, v_buf, table, rows_idx, lens, HEAD_DIM ** -0.5, ctx, config=cfg)
                err = ((call().float() - want).abs().max() / want.abs().max()).item()
                ms = time_ms(call)
                row = {"kv": name, "layout": layout, "variant": var, "default": cfg == default, "ms": ms,
                       "floor_ms": floor, "of_floor": floor / ms, "rel_err": err}
                print(json.dumps(row), flush=True)
                result["rows"].append(row)
                path.write_text(json.dumps(result, indent=1))
            del k_buf, v_buf, bufs
            torch.cuda.empty_cache()
    for kv in ("fp8_e4m3", "bf16"):
        for layout in ("slot_major", "head_major"):
            rs = [r for r in result["rows"] if r["kv"] == kv and r["layout"] == layout]
            if rs:
                b = min(rs, key=lambda r: r["ms"])
                d = next((r for r in rs if r["default"]), b)
                print(f"{kv:9s} {layout:10s} default {d['ms']:.3f} ms, best {b['variant']} {b['ms']:.3f} ms "
                      f"({b['of_floor']:.2f} of floor)")


def short_part(args) -> None:
    from benchmarks.lib.gpu_timing import graph_us
    from radixlm.runtime.kernels.attention import decode_attention
    from radixlm.runtime.kernels.attention.decode_splits import (
        DECODE_VARIANTS, KvWiden, decode_kernel_config, decode_wide_rows)

    dev, ctx, copies = "cuda", args.context, 4
    result = {"benchmark": "kv_packed_probe short", "gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
              "context": ctx, "rows": []}
    path = Path(args.out) / "decode_short_probe.json"
    for bs in (16, 32, 64):
        table, lens, rows_idx, q = requests(bs, ctx, dev)
        pools = [(torch.randn(bs * ctx + 1, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16) * 0.5,
                  torch.randn(bs * ctx + 1, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16) * 0.5)
                 for _ in range(copies)]
        floor_us = 2 * pools[0][0].numel() * 2 / args.bandwidth * 1e6
        default = decode_kernel_config(False, bs >= decode_wide_rows(KV_HEADS))
        want = decode_attention(q, *pools[0], table, rows_idx, lens, HEAD_DIM ** -0.5, ctx).float()
        for var, cfg in DECODE_VARIANTS.items():
            if cfg.widen != KvWiden.QUERY:
                continue
            for splits in (1, 2):
                def call(i, cfg=cfg, splits=splits):
                    return decode_attention(q, *pools[i], table, rows_idx, lens, HEAD_DIM ** -0.5, ctx, splits,
                                            config=cfg)
                try:
                    err = ((call(0).float() - want).abs().max() / want.abs().max()).item()
                    us = graph_us(call, copies)
                except Exception as e:  # noqa: BLE001 - a config the compiler refuses
                    print(bs, var, splits, "failed:", str(e)[:160], flush=True)
                    continue
                row = {"batch": bs, "variant": var, "splits": splits, "default": cfg == default and splits == 1,
                       "us": us, "floor_us": floor_us, "of_floor": floor_us / us, "rel_err": err}
                print(json.dumps(row), flush=True)
                result["rows"].append(row)
                path.write_text(json.dumps(result, indent=1))
        del pools
        torch.cuda.empty_cache()
    for bs in (16, 32, 64):
        rs = [r for r in result["rows"] if r["batch"] == bs]
        if rs:
            b = min(rs, key=lambda r: r["us"])
            d = next((r for r in rs if r["default"]), b)
            print(f"batch {bs}: default {d['variant']} {d['us']:.1f} us, best {b['variant']} x{b['splits']} "
                  f"{b['us']:.1f} us (floor {b['floor_us']:.1f})")


if __name__ == "__main__":
    main()
