"""W4A16's dequantize-then-GEMM path (kernels/quant/int4_dequant.py): the dequantization kernel against
reference.dequant_int4 under TRITON_INTERPRET=1 (one subprocess; exact) on AWQ's and GPTQ's layouts as the loader
converts them (act-order on and off, symmetric and not), group sizes 32, 12 (not a multiple of 8), one group, N and K
past a tile, and int4_linear_cuda's dispatch choosing the path by rows and by the tuned table; on the CPU, the table's
kind w4a16_dequant, the per-device scratch, the warm-up's rows; on CUDA (skipped without), Llama-like shapes, the
table's min_rows, and CUDA graphs."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.kernels.quant import int4_dequant, quant_tuned
from radixlm.runtime.kernels.quant import reference as ref
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "int4 dequant cases passed"


def _weights(fmt_name: str, n: int, k: int, group: int, act: bool, sym: bool, g: torch.Generator):
    """(Int4Weight as the loader converts it, the float weight it stands for: checkpoint channel order)."""
    from radixlm.runtime.quantization.int4 import default_g_idx, quantize_codes
    from radixlm.runtime.quantization.int4_formats import AWQFormat, GPTQFormat

    fmt = AWQFormat() if fmt_name == "awq" else GPTQFormat(act_order=act, symmetric=sym)
    w = torch.randn(n, k, generator=g) * 0.05
    order = torch.randperm(k, generator=g) if act else None
    codes = quantize_codes(w, group, sym, order)
    g_idx = codes.g_idx if act else default_g_idx(k, group)
    int4 = fmt.convert(fmt.pack(codes), g_idx, torch.float32, "test", None)
    return int4, int4.dequantize(torch.float32)


def _spy(monkeypatch_like, module, name: str, calls: list) -> None:
    real = getattr(module, name)
    monkeypatch_like(module, name, lambda *a, **kw: calls.append(name) or real(*a, **kw))


def run_cases() -> None:
    from radixlm.runtime.kernels.quant import int4_gemm
    from radixlm.runtime.kernels.quant.int4_dequant import DequantChoice, DequantConfig

    g = torch.Generator().manual_seed(0)
    small = DequantConfig(32, 8, 1)  # N 72 and K 160 span three tiles each, the last ones partial
    for fmt, n, k, group, act, sym in (("awq", 72, 160, 32, False, False), ("gptq", 72, 160, 32, True, True),
                                       ("gptq", 40, 256, 256, False, False), ("gptq", 24, 96, 32, True, False)):
        int4, w = _weights(fmt, n, k, group, act, sym, g)
        for dtype in (torch.float32, torch.float16) if fmt == "awq" else (torch.float32,):
            out = torch.empty(n, k, dtype=dtype)
            got = int4_dequant.dequant_int4_into(int4.qweight, int4.scales.to(dtype), int4.zeros.to(dtype),
                                                 int4.group_size, out, small)
            want = ref.dequant_int4(int4.qweight, int4.scales.to(dtype), int4.zeros.to(dtype), int4.group_size, dtype)
            assert torch.equal(got, want), (fmt, n, k, group, act, sym, dtype)
        x = torch.randn(5, k, generator=g)
        bias = torch.randn(n, generator=g)
        y = int4_dequant.w4a16_dequant_linear(x, int4.qweight, int4.scales, int4.zeros, int4.group_size, int4.perm,
                                              bias, torch.empty(n, k), small)
        torch.testing.assert_close(y, ref.int4_linear(x, int4.qweight, int4.scales, int4.zeros, int4.group_size,
                                                      int4.perm, bias), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y, x @ w.t() + bias, rtol=1e-4, atol=1e-4)  # the checkpoint's own weight
    # a group of 12 channels: words straddle groups (per-channel scales in the kernel)
    qw, sc, z = ref.quant_int4(torch.randn(24, 96, generator=g), 12)
    assert torch.equal(int4_dequant.dequant_int4_into(qw, sc, z, 12, torch.empty(24, 96), small),
                       ref.dequant_int4(qw, sc, z, 12))

    # int4_linear_cuda's dispatch (CPU tensors run the Triton kernels here): by rows, then by the table
    calls: list = []
    patch = setattr  # (a script of its own: nothing to restore)
    _spy(patch, int4_dequant, "w4a16_dequant_linear", calls)
    _spy(patch, int4_gemm, "w4a16_linear", calls)
    qw, sc, z = ref.quant_int4(torch.randn(16, 256, generator=g) * 0.05, 128, dtype=torch.float16)
    for m, path in ((6, "w4a16_linear"), (int4_dequant.DEFAULT_MIN_ROWS, "w4a16_dequant_linear")):
        x = torch.randn(m, 256, generator=g).half()
        calls.clear()
        got = int4_gemm.int4_linear_cuda(x, qw, sc, z, 128)
        assert calls == [path], (m, calls)
        torch.testing.assert_close(got.float(), ref.int4_linear(x.float(), qw, sc.float(), z.float(), 128),
                                   rtol=2e-2, atol=2e-2)
    patch(quant_tuned, "lookup_dequant", lambda device, n, k, group: DequantChoice(6, small) if n == 16 else None)
    for m, path in ((5, "w4a16_linear"), (6, "w4a16_dequant_linear")):
        calls.clear()
        int4_gemm.int4_linear_cuda(torch.randn(m, 256, generator=g).half(), qw, sc, z, 128)
        assert calls == [path], (m, calls)
    print(MARKER)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter (3.7+)")
def test_int4_dequant_matches_the_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=120)


def _entry(**kw) -> dict:
    return {"kernel": "w4a16_dequant", "n": 4096, "k": 4096, "group": 128, "min_rows": 256,
            "config": {"block_n": 64, "block_kp": 16, "num_warps": 4}, **kw}


def test_the_table_takes_the_dequant_kind_and_refuses_bad_entries():
    from radixlm.runtime.kernels.gemm.cublaslt import load_table

    table = quant_tuned.parse([_entry(), _entry(n=6144, min_rows=None), {k: v for k, v in _entry(k=14336).items()
                                                                          if k != "config"}])
    key = quant_tuned.TunedKey("w4a16_dequant", 4096, 4096, 0, 128)
    assert table[key] == int4_dequant.DequantChoice(256, int4_dequant.DequantConfig(64, 16, 4))
    assert table[quant_tuned.TunedKey("w4a16_dequant", 6144, 4096, 0, 128)].min_rows is None
    assert table[quant_tuned.TunedKey("w4a16_dequant", 4096, 14336, 0, 128)].config == int4_dequant.DequantConfig()
    for bad in (_entry(min_rows=0), _entry(min_rows=1.5), _entry(min_rows=True), _entry(rows=256),
                {k: v for k, v in _entry().items() if k != "min_rows"}, _entry(config={"block_n": 48}),
                _entry(config={"tile": 1})):
        with pytest.raises(ValueError, match="bad quant_gemv tuned entry"):
            quant_tuned.parse([bad])
    quant_tuned.parse(load_table("NVIDIA H200", "quant_gemv"))  # the committed table stays valid


def test_the_choice_follows_rows_and_the_table(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    default = int4_dequant.choice_for(cpu, 4096, 4096, 128)
    assert default == int4_dequant.DEFAULT_CHOICE and default.min_rows == 512
    assert not default.takes(511) and default.takes(512) and default.takes(8192)
    entries = [_entry(), _entry(n=6144, min_rows=None)]
    monkeypatch.setattr(quant_tuned, "_table", lambda name: quant_tuned.parse(entries))
    monkeypatch.setattr(quant_tuned, "_device_name", lambda index: "NVIDIA H200")
    assert int4_dequant.choice_for(gpu, 4096, 4096, 128).min_rows == 256
    never = int4_dequant.choice_for(gpu, 6144, 4096, 128)
    assert never.min_rows is None and not never.takes(1 << 20)
    assert int4_dequant.choice_for(gpu, 4096, 4096, 64) == int4_dequant.DEFAULT_CHOICE  # no entry for group 64
    assert int4_dequant.choice_for(cpu, 4096, 4096, 128) == int4_dequant.DEFAULT_CHOICE  # no table off CUDA


def test_the_scratch_grows_reuses_and_holds_still_once_captured():
    s = int4_dequant.DequantScratch(torch.device("cpu"))
    a = s.take(4, 8, torch.float16, capturing=False)
    assert a.shape == (4, 8) and a.dtype == torch.float16 and s.nbytes == 64
    b = s.take(2, 8, torch.bfloat16, capturing=False)
    assert b.data_ptr() == a.data_ptr() and s.nbytes == 64  # a smaller layer: the same memory
    assert s.take(8, 8, torch.float16, capturing=True) is None  # no allocation inside a capture
    c = s.take(8, 8, torch.float16, capturing=False)
    assert c.shape == (8, 8) and s.nbytes == 128
    assert s.take(8, 8, torch.float16, capturing=True).data_ptr() == c.data_ptr()
    d = s.take(16, 8, torch.float16, capturing=False)  # after a capture used it: a temporary, the buffer kept
    assert d.shape == (16, 8) and s.nbytes == 128 and d.data_ptr() != c.data_ptr()
    assert int4_dequant.scratch_for(torch.device("cpu")) is int4_dequant.scratch_for(torch.device("cpu"))
    with pytest.raises(ValueError, match="min_rows"):
        int4_dequant.DequantChoice(0)


def test_warm_up_runs_the_extra_rows():
    from radixlm.runtime.kernels import quant

    rows: list[int] = []
    quant.warm_up_linear(lambda x: rows.append(x.shape[0]), 8, torch.float32, "cpu", extra_rows=(512, 257))
    assert rows[-2:] == [257, 512] and len(rows) == len(set(rows))
    rows.clear()
    quant.warm_up_linear(lambda x: rows.append(x.shape[0]), 8, torch.float32, "cpu", 300, extra_rows=(512,))
    assert max(rows) == 257
    qw, _, _ = ref.quant_int4(torch.randn(16, 128), 128)
    assert quant.int4_warmup_rows(qw, 128, torch.bfloat16) == ()  # CPU: one path


def test_the_benchmarks_choice_and_merged_table():
    from benchmarks.lib.w4a16_dequant import merged_table, min_rows, table_entry

    def cells(*pairs):
        return [{"rows": m, "dequant_us": d, "current_us": c, "bf16_us": 1.0, "ok": True} for m, d, c in pairs]

    assert min_rows(cells((128, 90, 80), (256, 90, 100), (1024, 200, 400))) == 256
    assert min_rows(cells((128, 50, 80), (256, 110, 100), (1024, 200, 400))) == 1024  # wins only from 1024 on
    assert min_rows(cells((128, 50, 80), (1024, 400, 400))) is None  # loses (within the margin) at the largest
    assert min_rows([{**c, "ok": False} for c in cells((128, 1, 80))]) is None
    shape = {"n": 4096, "k": 4096, "group": 128, "config": {"block_n": 128, "block_kp": 16, "num_warps": 8},
             "rows": cells((256, 90, 100))}
    old = {"gpu": "NVIDIA H200", "commands": ["sweep"],
           "entries": [_entry(min_rows=1024), _entry(n=6144), {"kernel": "w4a16_mma", "n": 4096, "k": 4096, "rows": 8,
                       "group": 128, "config": {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4,
                                                "num_stages": 3}}]}
    table = merged_table(old, [table_entry(shape)], "quant_gemm.py --w4a16-dequant", "NVIDIA H200")
    parsed = quant_tuned.parse(table["entries"])
    assert len(parsed) == 3 and table["commands"][-1] == "quant_gemm.py --w4a16-dequant"
    assert parsed[quant_tuned.TunedKey("w4a16_dequant", 4096, 4096, 0, 128)].min_rows == 256


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dequant_path_cuda(monkeypatch):
    from radixlm.runtime.kernels import quant
    from radixlm.runtime.kernels.quant import int4_gemm

    for n, k, group in ((4096, 4096, 128), (1024, 14336, 128), (512, 1536, 96), (256, 96, 12)):
        for dtype in (torch.bfloat16, torch.float16):
            qw, sc, z = ref.quant_int4(torch.randn(n, k, device="cuda") * 0.02, group, dtype=dtype)
            out = torch.empty(n, k, device="cuda", dtype=dtype)
            assert torch.equal(int4_dequant.dequant_int4_into(qw, sc, z, group, out),
                               ref.dequant_int4(qw, sc, z, group, dtype)), (n, k, group, dtype)
    calls: list = []
    _spy(monkeypatch.setattr, int4_dequant, "w4a16_dequant_linear", calls)
    qw, sc, z = ref.quant_int4(torch.randn(2048, 4096, device="cuda") * 0.02, 128, dtype=torch.bfloat16)
    perm = torch.randperm(4096, device="cuda")
    bias = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    for m in (511, 512, 1000):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        calls.clear()
        got = quant.int4_linear(x, qw, sc, z, 128, perm, bias)
        assert calls == (["w4a16_dequant_linear"] if m >= 512 else []), m
        torch.testing.assert_close(got.float(), ref.int4_linear(x, qw, sc, z, 128, perm, bias).float(),
                                   rtol=2e-2, atol=2e-2)
    assert quant.int4_warmup_rows(qw, 128, torch.bfloat16) == (512,)
    entries = [{"kernel": "w4a16_dequant", "n": 2048, "k": 4096, "group": 128, "min_rows": 64}]
    monkeypatch.setattr(quant_tuned, "_table", lambda name: quant_tuned.parse(entries))
    for m, taken in ((63, False), (64, True)):
        calls.clear()
        quant.int4_linear(torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16), qw, sc, z, 128)
        assert calls == (["w4a16_dequant_linear"] if taken else []), m
    # a capture: with the scratch grown it replays the path; a scratch too small falls back to the tile kernels
    x = torch.randn(200, 4096, device="cuda", dtype=torch.bfloat16)
    int4_gemm.w4a16_linear(x, qw, sc, z, 128)  # builds the tile kernel outside the capture
    for fresh in (False, True):
        if fresh:
            monkeypatch.setattr(int4_dequant, "scratch_for", lambda device, s=int4_dequant.DequantScratch(
                torch.device("cuda", torch.cuda.current_device())): s)
        else:
            quant.int4_linear(x, qw, sc, z, 128)
        calls.clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = quant.int4_linear(x, qw, sc, z, 128)
        assert calls == ([] if fresh else ["w4a16_dequant_linear"])
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(y.float(), ref.int4_linear(x, qw, sc, z, 128).float(), rtol=2e-2, atol=2e-2)


if __name__ == "__main__":
    run_cases()
