"""benchmarks/kernels/quant_gemv_sweep.py without a GPU: the layer's sums of both kinds, and the tuned table's
entries a sweep replaces (those it measured again, whether or not they still beat the default)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.kernels import quant_gemv_sweep as sweep  # noqa: E402
from benchmarks.lib.quant_sweep import merge_entries  # noqa: E402


def _cell(shape: str, rows: int, default: float, best: float | None, **extra) -> dict:
    return {"shape": shape, "rows": rows, "bf16_us": 10.0, "default_us": default, "best_us": best, "floor_us": 1.0,
            **extra}


def test_layer_sums_take_the_faster_of_default_and_best_and_skip_partial_rows():
    mma = [_cell(s, 8, 4.0, 3.0 if s != "o_proj" else None) for s in sweep.LAYER] + [_cell("o_proj", 16, 1.0, 1.0)]
    (row,) = sweep.layer_sums(sweep.Kind.MMA, mma, [8, 16])  # rows 16 lack three shapes
    assert row == {"rows": 8, "bf16_us": 40.0, "default_us": 16.0, "mma_us": 13.0, "floor_us": 4.0}
    gemv = [_cell(s, 1, 5.0, 6.0, format=f) for s in sweep.LAYER for f in ("fp8_channel", "w4a16")]
    gemv = [c for c in gemv if not (c["format"] == "w4a16" and c["shape"] == "down_proj")]
    (row,) = sweep.layer_sums(sweep.Kind.GEMV, gemv, [1])
    assert row["fp8_channel"] == {"default_us": 20.0, "tuned_us": 20.0, "floor_us": 4.0}
    assert row["bf16_us"] == 40.0 and "w4a16" not in row  # one shape short: no layer sum


def test_a_sweep_replaces_what_it_measured_and_keeps_the_rest():
    def entry(kernel: str, n: int, rows: int, group: int) -> dict:
        return {"kernel": kernel, "n": n, "k": 4096, "rows": rows, "group": group, "config": {}, "us": 1.0}

    committed = [entry("fp8_channel", 4096, 1, 0), entry("fp8_channel", 6144, 1, 0), entry("w4a16_mma", 4096, 8, 128)]
    new = [entry("fp8_channel", 4096, 1, 0) | {"us": 0.5}]
    swept = {("fp8_channel", 4096, 4096, 1, 0), ("fp8_channel", 6144, 4096, 1, sweep.group_of("fp8_channel"))}
    merged = merge_entries(committed, new, swept)
    assert merged == [entry("w4a16_mma", 4096, 8, 128), new[0]]  # 6144: measured again, no longer a gain
    assert sweep.group_of("fp8_block") == 128 and sweep.group_of("w4a16") == sweep.GROUP


def test_vary_specs_parse_to_typed_values_and_refuse_a_bare_field():
    import pytest

    assert sweep.parse_vary(["split_k=1,2", "fused_act=true,False", "x_load=gathered"]) == {
        "split_k": [1, 2], "fused_act": [True, False], "x_load": ["gathered"]}
    for bad in (["split_k"], ["=1"], ["split_k="]):
        with pytest.raises(ValueError, match="FIELD=V1"):
            sweep.parse_vary(bad)


def test_merge_keeps_a_fused_steps_entry_apart_from_the_plain_one():
    plain = {"kernel": "fp8_channel", "n": 6144, "k": 4096, "rows": 1, "group": 0, "config": {"block_n": 8}}
    fused = {**plain, "step": "add_rmsnorm+rotary", "config": {"block_n": 16}}
    assert merge_entries([plain], [fused], {("fp8_channel", 6144, 4096, 1, 0, "add_rmsnorm+rotary")}) == [plain, fused]
    # the plain entry swept again (a five-field key stands for the plain GEMM) and no longer a gain: the fused stays
    assert merge_entries([plain, fused], [], {("fp8_channel", 6144, 4096, 1, 0)}) == [fused]
