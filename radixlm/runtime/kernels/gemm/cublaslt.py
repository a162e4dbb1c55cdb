"""cuBLASLt through ctypes: one GEMM shape's descriptors, the algorithms cuBLASLt offers or accepts for it, a call
that runs a chosen one, and the per-GPU-model table of tuned configurations.

torch's matmul runs the first algorithm cuBLAS's heuristic picks for a shape. At the decode GEMMs' row counts other
configurations of the same kernel family (tile, cluster shape, custom option) run 3-24% faster on an H100 and give
the same bits (benchmarks/results/kernels/h100/cublaslt/). benchmarks/kernels/cublaslt_tune.py finds them and writes the
table (tuned/); start-up installs its entries (tuned_gemm.py). The library is the one torch already loaded (found in
the process's mappings), so nothing is imported or linked here on a machine without CUDA.

Layout: y[m, n] = x[m, k] @ w[n, k]^T with all three row-major and contiguous, which in cuBLAS's column-major terms is
D[n, m] = op_T(A[k, n]) @ B[k, m]: the same "TN" GEMM torch issues for F.linear.

FP8 operands (float8_e4m3fn w and x, a 16-bit y) carry float32 scales, y = (x * x_scale) @ (w * w_scale)^T, in one of
LtScale's modes: one value each, or a vector each (w's per output channel, x's per row: cuBLASLt's outer-vector
mode, what torch._scaled_mm's row-wise scaling issues on Hopper).
"""
from __future__ import annotations

import ctypes
import enum
import itertools
import json
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

_COMPUTE_32F = 68
_R_32F, _R_16F, _R_16BF = 0, 2, 14
_OP_N, _OP_T = 0, 1
_R_8F_E4M3 = 28
_DESC_TRANSA, _DESC_TRANSB, _DESC_SM_COUNT_TARGET = 3, 4, 15
_DESC_A_SCALE_POINTER, _DESC_B_SCALE_POINTER, _DESC_A_SCALE_MODE, _DESC_B_SCALE_MODE = 17, 18, 31, 32
_PREF_MAX_WORKSPACE_BYTES = 1
_DTYPES = {torch.bfloat16: _R_16BF, torch.float16: _R_16F, torch.float8_e4m3fn: _R_8F_E4M3}


class LtScale(enum.Enum):
    """An FP8 GEMM's operand scales (cuBLASLt's cublasLtMatmulMatrixScale_t values); NONE for 16-bit operands."""

    NONE = -1
    TENSOR = 0  # one float32 for w, one for x
    ROW = 3  # w's (N,) per output channel and x's (M,) per row: the outer-vector mode


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _loaded_library() -> str:
    """Path of the libcublasLt torch loaded (after a CUDA matmul has run in this process)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "libcublasLt.so" in Path(path).name:
            return path
    raise RuntimeError("libcublasLt is not loaded in this process: run a CUDA matmul first")


class CublasLtError(RuntimeError):
    pass


class CublasLt:
    """A cuBLASLt handle (destroyed with this object) and the library's entry points."""

    def __init__(self, device: torch.device | str = "cuda") -> None:
        one = torch.ones(8, 8, device=device, dtype=torch.bfloat16)
        torch.matmul(one, one)  # loads the library, if nothing has yet
        self.lib = ctypes.CDLL(_loaded_library())
        ptr, vp, i32, size = ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        for name, args in (("cublasLtCreate", [ptr]), ("cublasLtMatmulDescCreate", [ptr, i32, i32]),
                           ("cublasLtMatmulDescSetAttribute", [vp, i32, vp, size]),
                           ("cublasLtMatrixLayoutCreate", [ptr, i32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]),
                           ("cublasLtMatmulPreferenceCreate", [ptr]),
                           ("cublasLtMatmulPreferenceSetAttribute", [vp, i32, vp, size]),
                           ("cublasLtMatmulAlgoGetHeuristic", [vp] * 7 + [i32, ctypes.POINTER(_Heuristic),
                                                                          ctypes.POINTER(i32)]),
                           ("cublasLtMatmul", [vp] * 12 + [ctypes.POINTER(_Algo), vp, size, vp]),
                           ("cublasLtMatmulAlgoGetIds", [vp] + [i32] * 7 + [ctypes.POINTER(i32), ctypes.POINTER(i32)]),
                           ("cublasLtMatmulAlgoInit", [vp] + [i32] * 7 + [ctypes.POINTER(_Algo)]),
                           ("cublasLtMatmulAlgoCapGetAttribute", [ctypes.POINTER(_Algo), i32, vp, size,
                                                                  ctypes.POINTER(size)]),
                           ("cublasLtMatmulAlgoConfigSetAttribute", [ctypes.POINTER(_Algo), i32, vp, size]),
                           ("cublasLtMatmulAlgoConfigGetAttribute", [ctypes.POINTER(_Algo), i32, vp, size,
                                                                     ctypes.POINTER(size)]),
                           ("cublasLtMatmulAlgoCheck", [vp] * 6 + [ctypes.POINTER(_Algo), ctypes.POINTER(_Heuristic)]),
                           ("cublasLtDestroy", [vp]), ("cublasLtMatmulDescDestroy", [vp]),
                           ("cublasLtMatrixLayoutDestroy", [vp]), ("cublasLtMatmulPreferenceDestroy", [vp])):
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = i32, args
        self.handle = ctypes.c_void_p()
        with torch.cuda.device(torch.device(device)):
            self.check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        weakref.finalize(self, self.lib.cublasLtDestroy, self.handle)

    @staticmethod
    def check(status: int, what: str) -> None:
        if status != 0:
            raise CublasLtError(f"{what} returned cuBLAS status {status}")


def _destroy(lib, desc, layouts) -> None:
    lib.cublasLtMatmulDescDestroy(desc)
    for layout in layouts:
        lib.cublasLtMatrixLayoutDestroy(layout)


@dataclass
class LtGemm:
    """y[m, n] = x[m, k] @ w[n, k]^T for one (m, n, k, dtype): descriptors made once; `candidates` (the heuristic's
    list, `enumerate_algos`'s, or one tuned configuration: set by the caller) and `algo_index` choose what runs.
    FP8 operands (dtype float8_e4m3fn) name their output's dtype (out_dtype) and their scales' mode (scales)."""

    lt: CublasLt
    m: int
    n: int
    k: int
    dtype: torch.dtype
    workspace: torch.Tensor | None = None  # None: only algorithms that need no workspace
    sm_count: int = 0  # SMs the heuristic and the kernel may count on (0: the device's); fewer leave room beside it
    candidates: list = field(default_factory=list)
    algo_index: int = 0
    out_dtype: torch.dtype | None = None  # None: dtype (16-bit operands)
    scales: LtScale = LtScale.NONE

    def __post_init__(self) -> None:
        self.out_dtype = self.out_dtype or self.dtype
        if (self.dtype == torch.float8_e4m3fn) != (self.scales is not LtScale.NONE) or self.out_dtype not in (
                torch.bfloat16, torch.float16):
            raise ValueError(f"FP8 operands take scales and a 16-bit output, others neither: {self.dtype}, "
                             f"{self.scales}, output {self.out_dtype}")
        lib, check = self.lt.lib, self.lt.check
        kind, out_kind = _DTYPES[self.dtype], _DTYPES[self.out_dtype]
        self.desc = ctypes.c_void_p()
        check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), _COMPUTE_32F, _R_32F), "MatmulDescCreate")
        attrs = [(_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N), (_DESC_SM_COUNT_TARGET, self.sm_count)]
        if self.scales is not LtScale.NONE:
            attrs += [(_DESC_A_SCALE_MODE, self.scales.value), (_DESC_B_SCALE_MODE, self.scales.value)]
        for attr, op in attrs:
            value = ctypes.c_int32(op)
            check(lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(value), 4), "MatmulDescSetAttr")
        self.a_layout, self.b_layout, self.d_layout = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        for layout, lkind, rows, cols, ld in ((self.a_layout, kind, self.k, self.n, self.k),
                                              (self.b_layout, kind, self.k, self.m, self.k),
                                              (self.d_layout, out_kind, self.n, self.m, self.n)):
            check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), lkind, rows, cols, ld), "MatrixLayoutCreate")
        weakref.finalize(self, _destroy, lib, self.desc, (self.a_layout, self.b_layout, self.d_layout))
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._scale_ptrs = (0, 0)  # the (w, x) scale pointers the descriptor holds
        self._placeholder: torch.Tensor | None = None  # scales the descriptor points at before the first call

    @property
    def workspace_bytes(self) -> int:
        return 0 if self.workspace is None else self.workspace.numel() * self.workspace.element_size()

    def heuristic(self, max_algos: int = 32) -> list:
        """The algorithms cuBLASLt's heuristic offers for this GEMM, best first by its own estimate."""
        self._placeholder_scales()
        lib, check = self.lt.lib, self.lt.check
        pref = ctypes.c_void_p()
        check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "MatmulPreferenceCreate")
        ws_bytes = ctypes.c_uint64(self.workspace_bytes)
        check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws_bytes), 8),
              "MatmulPreferenceSetAttribute")
        results = (_Heuristic * max_algos)()
        count = ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(self.lt.handle, self.desc, self.a_layout, self.b_layout,
                                                    self.d_layout, self.d_layout, pref, max_algos, results,
                                                    ctypes.byref(count))
        lib.cublasLtMatmulPreferenceDestroy(pref)
        check(status, "MatmulAlgoGetHeuristic")
        return [results[i] for i in range(count.value) if results[i].state == 0]

    def checked(self, algo: _Algo) -> _Heuristic | None:
        """algo with the workspace it needs, if cuBLASLt accepts it for this GEMM within this workspace."""
        self._placeholder_scales()
        result = _Heuristic()
        if self.lt.lib.cublasLtMatmulAlgoCheck(self.lt.handle, self.desc, self.a_layout, self.b_layout,
                                               self.d_layout, self.d_layout, ctypes.byref(algo),
                                               ctypes.byref(result)) != 0:
            return None
        if result.state != 0 or result.workspace_size > self.workspace_bytes:
            return None
        result.algo = algo
        return result

    def __call__(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
                 x_scale: torch.Tensor | None = None, w_scale: torch.Tensor | None = None) -> torch.Tensor:
        """FP8 operands: x_scale and w_scale contiguous float32, (M,) and (N,) elements (LtScale.ROW) or one each."""
        assert x.shape == (self.m, self.k) and w.shape == (self.n, self.k)
        assert x.dtype == w.dtype == self.dtype and x.is_contiguous() and w.is_contiguous()
        if out is None:
            out = torch.empty((self.m, self.n), dtype=self.out_dtype, device=x.device)
        assert out.shape == (self.m, self.n) and out.is_contiguous() and out.dtype == self.out_dtype
        if self.scales is not LtScale.NONE:
            self._set_scales(x_scale, w_scale)
        choice = self.candidates[self.algo_index]
        workspace = 0 if self.workspace is None else self.workspace.data_ptr()
        self.lt.check(self.lt.lib.cublasLtMatmul(
            self.lt.handle, self.desc, ctypes.addressof(self._alpha), w.data_ptr(), self.a_layout, x.data_ptr(),
            self.b_layout, ctypes.addressof(self._beta), out.data_ptr(), self.d_layout, out.data_ptr(),
            self.d_layout, ctypes.byref(choice.algo), workspace, choice.workspace_size,
            torch.cuda.current_stream().cuda_stream), "cublasLtMatmul")
        return out

    def _placeholder_scales(self) -> None:
        """Scale pointers before the first call: cuBLASLt's heuristic and check refuse row-wise scales without them
        (status 7)."""
        if self.scales is not LtScale.NONE and self._scale_ptrs == (0, 0):
            rows = (self.m, self.n) if self.scales is LtScale.ROW else (1, 1)
            self._placeholder = torch.ones(sum(rows), dtype=torch.float32, device="cuda")
            self._set_scales(self._placeholder[:rows[0]], self._placeholder[rows[0]:])

    def _set_scales(self, x_scale: torch.Tensor, w_scale: torch.Tensor) -> None:
        rows = (self.m, self.n) if self.scales is LtScale.ROW else (1, 1)
        for t, count in ((x_scale, rows[0]), (w_scale, rows[1])):
            assert t.dtype == torch.float32 and t.numel() == count and t.is_contiguous(), (t.shape, count)
        ptrs = (w_scale.data_ptr(), x_scale.data_ptr())
        if ptrs != self._scale_ptrs:
            for attr, ptr in zip((_DESC_A_SCALE_POINTER, _DESC_B_SCALE_POINTER), ptrs):
                value = ctypes.c_void_p(ptr)
                self.lt.check(self.lt.lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(value), 8),
                              "MatmulDescSetAttr")
            self._scale_ptrs = ptrs


# cublasLtMatmulAlgoConfigAttributes_t (an algorithm's configuration, by name) and cublasLtMatmulAlgoCapAttributes_t
_CONFIG = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6, "inner": 7,
           "cluster": 8}
_CONFIG_WIDTH = {"inner": ctypes.c_uint16, "cluster": ctypes.c_uint16}
_CAP_SPLITK, _CAP_REDUCTION_MASK, _CAP_SWIZZLE, _CAP_TILES, _CAP_CUSTOM_MAX, _CAP_STAGES = 0, 1, 2, 6, 7, 13


def algo_config(lt: CublasLt, algo: _Algo) -> dict[str, int]:
    """An algorithm's configuration (id, tile, split-K, ...), as cuBLASLt reports it."""
    out = {}
    for name, attr in _CONFIG.items():
        value, written = _CONFIG_WIDTH.get(name, ctypes.c_uint32)(0), ctypes.c_size_t(0)
        lt.check(lt.lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(value),
                                                             ctypes.sizeof(value), ctypes.byref(written)),
                 "AlgoConfigGetAttribute")
        out[name] = value.value
    return out


def _types(gemm: LtGemm) -> tuple[int, int, int, int]:
    """cuBLASLt's (A, B, C, D) data types of this GEMM."""
    kind, out_kind = _DTYPES[gemm.dtype], _DTYPES[gemm.out_dtype]
    return kind, kind, out_kind, out_kind


def _init_algo(gemm: LtGemm, algo_id: int) -> _Algo | None:
    algo = _Algo()
    status = gemm.lt.lib.cublasLtMatmulAlgoInit(gemm.lt.handle, _COMPUTE_32F, _R_32F, *_types(gemm), algo_id,
                                                ctypes.byref(algo))
    return algo if status == 0 else None


def configured(gemm: LtGemm, config: dict[str, int], base: _Algo | None = None) -> _Heuristic | None:
    """The algorithm `config` names (algo_config's fields; the id's defaults for those missing), if cuBLASLt accepts
    it for this GEMM within its workspace."""
    base = base if base is not None else _init_algo(gemm, config["id"])
    if base is None:
        return None
    algo = _Algo()
    ctypes.memmove(ctypes.byref(algo), ctypes.byref(base), ctypes.sizeof(_Algo))
    for name, value in config.items():
        if name != "id":
            v = _CONFIG_WIDTH.get(name, ctypes.c_uint32)(value)
            if gemm.lt.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), _CONFIG[name], ctypes.byref(v),
                                                                ctypes.sizeof(v)) != 0:
                return None
    return gemm.checked(algo)


def _cap_array(lt: CublasLt, algo: _Algo, attr: int) -> list[int]:
    written = ctypes.c_size_t(0)
    lt.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, None, 0, ctypes.byref(written))
    count = written.value // 4
    if count == 0:
        return []
    values = (ctypes.c_uint32 * count)()
    lt.check(lt.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, values, 4 * count,
                                                      ctypes.byref(written)), "AlgoCapGetAttribute")
    return list(values)


def _cap_int(lt: CublasLt, algo: _Algo, attr: int) -> int:
    value, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
    lt.check(lt.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, ctypes.byref(value), 4,
                                                      ctypes.byref(written)), "AlgoCapGetAttribute")
    return value.value


def enumerate_algos(gemm: LtGemm, splitks=(1, 2, 3, 4, 6, 8), max_custom: int = 2, limit: int = 4000,
                    only_ids: tuple = (), clusters: tuple = (0,)) -> list:
    """Every (algorithm id, tile, stages, split-K, reduction, swizzle, custom option, cluster shape) cuBLASLt accepts
    for this GEMM, beyond the heuristic's short list: candidates for a timed search
    (benchmarks/kernels/cublaslt_tune.py)."""
    lt = gemm.lt
    ids, count = (ctypes.c_int * 256)(), ctypes.c_int(0)
    lt.check(lt.lib.cublasLtMatmulAlgoGetIds(lt.handle, _COMPUTE_32F, _R_32F, *_types(gemm), 256, ids,
                                             ctypes.byref(count)), "AlgoGetIds")
    found = []
    for algo_id in [i for i in list(ids)[:count.value] if not only_ids or i in only_ids]:
        base = _init_algo(gemm, algo_id)
        if base is None:
            continue
        tiles = _cap_array(lt, base, _CAP_TILES) or [0]
        stages = _cap_array(lt, base, _CAP_STAGES) or [0]
        splitk_ok = _cap_int(lt, base, _CAP_SPLITK)
        red_mask = _cap_int(lt, base, _CAP_REDUCTION_MASK)
        swizzles = [0, 1] if _cap_int(lt, base, _CAP_SWIZZLE) else [0]
        customs = range(min(_cap_int(lt, base, _CAP_CUSTOM_MAX), max_custom) + 1)
        splits = [(1, 0)] + [(s, r) for s in splitks if s > 1 and splitk_ok for r in (1, 2, 4) if red_mask & r]
        for tile, stage, (split, red), swz, custom, cluster in itertools.product(tiles, stages, splits, swizzles,
                                                                                 customs, clusters):
            config = {"tile": tile, "stages": stage, "splitk": split, "reduction": red, "swizzle": swz,
                      "custom": custom, "cluster": cluster}
            result = configured(gemm, config, base)
            if result is not None:
                found.append(result)
                if len(found) >= limit:
                    return found
    return found


def table_path(device_name: str, kind: str = "cublaslt") -> Path:
    """The tuned table of one GPU model: kind "cublaslt" (benchmarks/kernels/cublaslt_tune.py writes it) or
    "quant_gemv" (the quantized few-row kernels' configs: benchmarks/kernels/quant_gemv_sweep.py)."""
    return Path(__file__).parent / "tuned" / f"{kind}_{re.sub(r'[^A-Za-z0-9]+', '_', device_name).strip('_')}.json"


def load_table(device_name: str, kind: str = "cublaslt") -> list[dict]:
    """The tuned table's entries for this GPU model (cublaslt: {n, k, m, dtype, config, us, cublas_us}; quant_gemv:
    kernels/quant/quant_tuned.py), none if it has no table."""
    path = table_path(device_name, kind)
    return json.loads(path.read_text())["entries"] if path.exists() else []
