"""ModelRunner on CPU: the start-up warm-up of eager passes (on CUDA it builds the Triton kernels) leaves nothing
behind that a request could see."""
from __future__ import annotations

from radixlm.runtime.kernels.startup import warm_up_kernels
from tests.runtime.scheduler.conftest import make_scheduler, request, run_all, tiny_model_dir  # noqa: F401 - fixture


def _run(sched) -> dict:
    for i, ids in enumerate(([5, 9, 13, 200, 41, 7, 300, 12], [5, 9, 13, 77])):
        sched.add_request(request(f"r{i}", ids, max_new_tokens=8))
    return {k: v["output_ids"] for k, v in run_all(sched).items()}


def test_warm_up_extend_leaves_no_trace(tiny_model_dir):
    reference = _run(make_scheduler(tiny_model_dir))
    sched = make_scheduler(tiny_model_dir)
    free_slots, free_rows = sched.allocator.available_size(), sched.req_to_token_pool.available_size()
    sched.runner.warm_up_extend()
    assert (sched.allocator.available_size(), sched.req_to_token_pool.available_size()) == (free_slots, free_rows)
    assert _run(sched) == reference
    sched.check_memory()


def test_warm_up_kernels_leaves_no_trace(tiny_model_dir):
    """The whole start-up warm-up (extend passes, eager passes of 1..4 rows) on CPU: outputs and pools unchanged."""
    reference = _run(make_scheduler(tiny_model_dir))
    sched = make_scheduler(tiny_model_dir)
    free_slots, free_rows = sched.allocator.available_size(), sched.req_to_token_pool.available_size()
    warm_up_kernels(sched.runner, graph_max_bs=0)
    assert (sched.allocator.available_size(), sched.req_to_token_pool.available_size()) == (free_slots, free_rows)
    assert _run(sched) == reference
    sched.check_memory()


def test_warm_up_kernels_runs_every_planned_variant(tiny_model_dir, monkeypatch):
    """With the Triton backend the warm-up's eager passes meet every split count of the plan, every row count up to
    the skinny GEMM's and each tensor-core GEMM's BLOCK_M, and both extend tiles (the passes recorded, not run: there
    is no GPU here)."""
    from radixlm.runtime.layers.attention.triton_backend import TritonAttnBackend
    from radixlm.runtime.kernels.attention import decode_num_splits
    from radixlm.runtime.kernels.gemm import SKINNY_MAX_M
    from radixlm.runtime.kernels.startup import decode_eager_splits, mma_warmup_rows, plan_warmup

    runner = make_scheduler(tiny_model_dir).runner
    runner.attn_backend = TritonAttnBackend(runner)
    passes, prefix_pairs = [], []
    monkeypatch.setattr(runner, "_run", lambda fb, plan: passes.append((fb.forward_mode, fb.batch_size,
                                                                         list(fb.seq_lens_cpu), fb.extend_seq_lens_cpu)))
    # The prefix kernel's warm-up launches it directly (shared-prefix decode is on by default): recorded too.
    monkeypatch.setattr(runner.attn_backend, "warm_up_shared_prefix", lambda layer, pairs: prefix_pairs.append(pairs))
    context, kv_heads = runner.model_config.context_len, runner.num_kv_heads
    for graph_max_bs in (0, 8, 512):
        passes.clear()
        prefix_pairs.clear()
        warm_up_kernels(runner, graph_max_bs)
        assert prefix_pairs == [plan_warmup(runner, graph_max_bs).shared_prefix] and prefix_pairs[0]
        token_rows = [(bs, lens) for mode, bs, lens, _ in passes if mode.is_token_rows()]
        assert {decode_num_splits(max(lens), bs, kv_heads) for bs, lens in token_rows} == set(
            decode_eager_splits(context, kv_heads, graph_max_bs))
        assert {bs for bs, _ in token_rows} >= set(range(1, SKINNY_MAX_M + 1)) | set(mma_warmup_rows(None))
        extend = [max(ext) for mode, _, _, ext in passes if mode.is_request_spans()]
        assert min(extend) <= 16 < max(extend)


def test_gemm_choice_counts_by_layer_kind_and_rows(tiny_model_dir):
    """The few-row GEMM choices (set by gemm.linear on CUDA, empty on CPU) counted per layer kind and row count; the
    layers of one kind share one memo (measured once for them all)."""
    from radixlm.runtime.kernels.gemm import format_gemm_choices

    runner = make_scheduler(tiny_model_dir).runner
    assert runner.gemm_choice_counts() == {}
    holders = dict(runner.gemm_holders())
    qkv = [n for n in holders if n.endswith("qkv_proj")]
    assert len(qkv) == runner.model_config.num_layers > 1 and list(holders)[-1] == "lm_head"
    memos = {name.rsplit(".", 1)[-1]: {id(h.gemm_choices) for n, h in holders.items() if n.endswith(name)}
             for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
    assert all(len(ids) == 1 for ids in memos.values()) and len(set.union(*memos.values())) == 4
    from radixlm.runtime.kernels.gemm import GemmKernel

    holders[qkv[0]].gemm_choices.update({1: GemmKernel.SKINNY, 2: GemmKernel.CUBLAS, 16: GemmKernel.SKINNY_MMA})
    holders["lm_head"].gemm_choices[1] = GemmKernel.CUBLAS
    counts = runner.gemm_choice_counts()
    n = len(qkv)
    assert counts == {"qkv_proj": {1: {"skinny": n}, 2: {"cublas": n}, 16: {"skinny_mma": n}},
                      "lm_head": {1: {"cublas": 1}}}
    assert format_gemm_choices(counts) == (f"qkv_proj 1: skinny {n}, 2: cublas {n}, 16: skinny_mma {n}; "
                                           "lm_head 1: cublas 1")
    # Layers of one kind measured apart (before the memo was shared) may differ: each kernel is counted.
    holders[qkv[1]].gemm_choices = {1: GemmKernel.CUBLAS}
    assert runner.gemm_choice_counts()["qkv_proj"][1] == {"skinny": n - 1, "cublas": 1}
