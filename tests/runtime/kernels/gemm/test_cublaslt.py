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
        assert e["dtype"] in ("bfloat16", "float16")
        assert set(e["config"]) == set(cublaslt._CONFIG) and e["config"]["splitk"] == 1
        assert e["us"] * table["margin"] <= e["cublas_us"]
        assert set(e) <= {"n", "k", "m", "dtype", "config", "us", "cublas_us", "workspace"}
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
