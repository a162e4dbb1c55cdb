"""The tuned cuBLASLt GEMMs (kernels/gemm: cublaslt.py, tuned_gemm.py, gemm.linear's memo entries): the committed
tables' form on any machine; on CUDA, the ctypes binding against torch's GEMM and start-up's install-and-dispatch."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.kernels.gemm import cublaslt, dispatch as gemm, tuned_gemm
from radixlm.runtime.kernels.gemm.skinny_mma import MMA_MAX_M
from radixlm.runtime.layers.linear import Linear

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TABLES = sorted((Path(cublaslt.__file__).parent / "tuned").glob("cublaslt_*.json"))


def test_table_path_names_the_gpu_model():
    assert cublaslt.table_path("NVIDIA H100 80GB HBM3").name == "cublaslt_NVIDIA_H100_80GB_HBM3.json"
    assert cublaslt.load_table("no such GPU") == []


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_committed_tables_are_well_formed(path):
    table = json.loads(path.read_text())
    seen = set()
    assert table["entries"]
    for e in table["entries"]:
        key = (e["n"], e["k"], e["m"], e["dtype"])
        assert key not in seen
        seen.add(key)
        assert e["m"] > MMA_MAX_M  # past the few-row kernels' choice keys: the memo's keys never collide
        fp8 = path.stem.startswith("cublaslt_fp8_")
        assert e["dtype"] == "float8_e4m3fn" if fp8 else e["dtype"] in ("bfloat16", "float16")
        # 16-bit entries are torch's bits (no split K); FP8 ones may split K, and say whether they are torch's bits
        assert set(e["config"]) == set(cublaslt._CONFIG) and (fp8 or e["config"]["splitk"] == 1)
        assert e["us"] * table["margin"] <= e["cublas_us"]
        assert set(e) <= {"n", "k", "m", "dtype", "config", "us", "cublas_us", "workspace"} | ({"identical"} if fp8
                                                                                              else set())
        assert e.get("workspace", 1) > 0  # absent when the configuration needs none


def test_kernel_of_names_memo_entries():
    assert gemm.kernel_of(gemm.GemmKernel.SKINNY) is gemm.GemmKernel.SKINNY
    assert gemm.kernel_of(object()) is gemm.GemmKernel.CUBLASLT


def _identical_config(lt, m, n, k, weight):
    """A configuration from the heuristic's list whose output is torch's, bit for bit."""
    probe = cublaslt.LtGemm(lt, m, n, k, weight.dtype)
    x = torch.randn(m, k, device="cuda", dtype=weight.dtype)
    for found in probe.heuristic():
        probe.candidates = [found]
        if torch.equal(probe(x, weight), F.linear(x, weight)):
            return cublaslt.algo_config(lt, found.algo)
    raise AssertionError("no heuristic algorithm reproduces torch's GEMM")


@needs_cuda
def test_heuristic_algorithms_compute_the_gemm():
    lt = cublaslt.CublasLt()
    m, n, k = 80, 384, 512
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    g = cublaslt.LtGemm(lt, m, n, k, torch.bfloat16)
    g.candidates = g.heuristic()
    assert g.candidates
    ref = x.double() @ w.double().t()
    for i in range(len(g.candidates)):
        g.algo_index = i
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        g(x, w, out)
        assert not out.isnan().any()
        assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


@needs_cuda
def test_sm_count_target_still_computes_the_gemm():
    lt = cublaslt.CublasLt()
    m, n, k = 256, 1024, 512
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    g = cublaslt.LtGemm(lt, m, n, k, torch.bfloat16, sm_count=max(1, sms // 2))
    g.candidates = g.heuristic()
    assert g.candidates
    ref = x.double() @ w.double().t()
    assert ((g(x, w).double() - ref).norm() / ref.norm()).item() < 1e-2


@needs_cuda
def test_configured_reproduces_an_algorithm():
    lt = cublaslt.CublasLt()
    m, n, k = 64, 256, 1024
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    g = cublaslt.LtGemm(lt, m, n, k, torch.bfloat16)
    for found in g.heuristic()[:3]:
        config = cublaslt.algo_config(lt, found.algo)
        again = cublaslt.configured(g, config)
        assert again is not None and cublaslt.algo_config(lt, again.algo) == config
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        g.candidates = [found]
        first = g(x, w)
        g.candidates = [again]
        assert torch.equal(g(x, w), first)
    assert cublaslt.configured(g, {**config, "tile": 1 << 20}) is None


@needs_cuda
def test_install_takes_identical_entries_and_gemm_linear_runs_them(monkeypatch):
    n, k, m = 256, 512, 96
    layer = Linear(k, n).to(device="cuda", dtype=torch.bfloat16)
    layer.weight.data.normal_()
    lt = cublaslt.CublasLt()
    config = _identical_config(lt, m, n, k, layer.weight)
    entry = {"n": n, "k": k, "m": m, "dtype": "bfloat16", "config": config, "us": 1.0, "cublas_us": 2.0}
    table = [entry, {**entry, "m": 128, "config": {**config, "tile": 1 << 20}},  # cuBLASLt refuses it: not taken
             {**entry, "m": MMA_MAX_M}]  # a few-row choice key: never taken
    assert tuned_gemm.install([("layer", layer)], torch.device("cuda"), table) == 1
    assert set(layer.gemm_choices) == {m}
    calls = []
    real_call = cublaslt.LtGemm.__call__

    def counted(self, *args, **kwargs):
        calls.append(self.m)
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(cublaslt.LtGemm, "__call__", counted)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert calls == [m]
    layer(torch.randn(128, k, device="cuda", dtype=torch.bfloat16))  # no entry: torch's GEMM
    assert calls == [m]
    assert tuned_gemm.install([("layer", layer)], torch.device("cuda"), table) == 0  # the memo has it already
    layer.gemm_choices.clear()
    assert tuned_gemm.install([("layer", layer)], torch.device("cuda"), [{**entry, "workspace": 1 << 20}]) == 1
    assert layer.gemm_choices[m].workspace_bytes == 1 << 20  # its own buffer, the size the entry names
    assert torch.equal(layer(x), F.linear(x, layer.weight))


class _FakeLib:
    """Stands in for libcublasLt on any machine: every entry point succeeds and is recorded by name."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("cublasLt"):
            raise AttributeError(name)
        return lambda *args: self.calls.append(name) or 0


def test_fp8_descriptors_set_the_scale_modes():
    from types import SimpleNamespace

    lib = _FakeLib()
    lt = SimpleNamespace(lib=lib, check=cublaslt.CublasLt.check, handle=None)
    cublaslt.LtGemm(lt, 64, 128, 256, torch.bfloat16)
    assert lib.calls.count("cublasLtMatmulDescSetAttribute") == 3  # transposes, SM count
    lib.calls.clear()
    cublaslt.LtGemm(lt, 64, 128, 256, torch.float8_e4m3fn, out_dtype=torch.bfloat16, scales=cublaslt.LtScale.ROW)
    assert lib.calls.count("cublasLtMatmulDescSetAttribute") == 5  # and A's and B's scale modes
    with pytest.raises(ValueError, match="FP8 operands take scales"):
        cublaslt.LtGemm(lt, 64, 128, 256, torch.float8_e4m3fn, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="FP8 operands take scales"):
        cublaslt.LtGemm(lt, 64, 128, 256, torch.bfloat16, scales=cublaslt.LtScale.ROW)


def _fp8_operands(m, n, k):
    from radixlm.runtime.kernels.quant.fp8_act import quant_fp8_per_token

    w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    w_scale = torch.rand(n, device="cuda") * 0.02 + 0.01
    q, s = quant_fp8_per_token(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    ref = torch._scaled_mm(q, w.t(), s, w_scale.reshape(1, -1), out_dtype=torch.bfloat16)
    return w, w_scale, q, s.reshape(-1), ref


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@needs_cuda
def test_fp8_row_scaled_algorithms_compute_scaled_mm():
    lt = cublaslt.CublasLt()
    m, n, k = 96, 512, 1024
    w, w_scale, q, s, ref = _fp8_operands(m, n, k)
    workspace = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    g = cublaslt.LtGemm(lt, m, n, k, torch.float8_e4m3fn, workspace, out_dtype=torch.bfloat16,
                        scales=cublaslt.LtScale.ROW)
    g.candidates = g.heuristic()
    assert g.candidates
    for i in range(len(g.candidates)):
        g.algo_index = i
        assert _rel(g(q, w, None, s, w_scale), ref) < 2e-3
    split = cublaslt.enumerate_algos(g, splitks=(2, 4), max_custom=0, limit=200,
                                     only_ids=(cublaslt.algo_config(lt, g.candidates[0].algo)["id"],))
    for found in [c for c in split if cublaslt.algo_config(lt, c.algo)["splitk"] > 1][:4]:
        g.candidates = [found]
        g.algo_index = 0
        assert _rel(g(q, w, None, s, w_scale), ref) < 2e-3
    other_scale = w_scale * 2  # new scale pointers reach the kernel
    g.candidates, g.algo_index = g.heuristic()[:1], 0
    assert _rel(g(q, w, None, s, other_scale), ref.float() * 2) < 1e-2


@needs_cuda
def test_install_puts_fp8_entries_in_fp8_layers_and_fp8_linear_runs_them(monkeypatch):
    from radixlm.runtime.kernels.quant import fp8_linear

    n, k, m = 512, 1024, 96
    lt = cublaslt.CublasLt()
    w, w_scale, _, _, _ = _fp8_operands(m, n, k)
    layer = Linear(k, n).to(device="cuda")
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    layer.weight_scale = w_scale.reshape(n, 1)
    layer.weight_block = None
    probe = cublaslt.LtGemm(lt, m, n, k, torch.float8_e4m3fn, out_dtype=torch.bfloat16, scales=cublaslt.LtScale.ROW)
    config = cublaslt.algo_config(lt, probe.heuristic()[0].algo)
    entry = {"n": n, "k": k, "m": m, "dtype": "float8_e4m3fn", "config": config, "us": 1.0, "cublas_us": 2.0}
    bf16_entry = {**entry, "dtype": "bfloat16"}  # another dtype's entry: not this layer's
    assert tuned_gemm.install([("layer", layer)], torch.device("cuda"), [entry, bf16_entry]) == 1
    assert isinstance(layer.gemm_choices[m], cublaslt.LtGemm)
    calls = []
    real_call = cublaslt.LtGemm.__call__
    monkeypatch.setattr(cublaslt.LtGemm, "__call__", lambda self, *a, **kw: calls.append(self.m) or real_call(
        self, *a, **kw))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    want = fp8_linear(x, layer.weight, layer.weight_scale)  # no memo: torch._scaled_mm
    assert calls == []
    assert _rel(fp8_linear(x, layer.weight, layer.weight_scale, tuned=layer.gemm_choices), want) < 2e-3
    assert calls == [m]
    static = torch.tensor(0.05, device="cuda")  # static activations: not the tuned GEMM's scales
    fp8_linear(x, layer.weight, layer.weight_scale, input_scale=static, tuned=layer.gemm_choices)
    assert calls == [m]
    layer.input_scale = static
    layer.gemm_choices.clear()
    assert tuned_gemm.install([("layer", layer)], torch.device("cuda"), [entry]) == 0


def test_descriptors_and_preferences_are_destroyed():
    import gc
    from types import SimpleNamespace

    lib = _FakeLib()
    g = cublaslt.LtGemm(SimpleNamespace(lib=lib, check=cublaslt.CublasLt.check, handle=None), 64, 128, 256,
                        torch.bfloat16)
    assert lib.calls.count("cublasLtMatrixLayoutCreate") == 3
    assert g.heuristic() == [] and lib.calls[-1] == "cublasLtMatmulPreferenceDestroy"
    del g
    gc.collect()
    assert lib.calls.count("cublasLtMatmulDescDestroy") == 1 and lib.calls.count("cublasLtMatrixLayoutDestroy") == 3
