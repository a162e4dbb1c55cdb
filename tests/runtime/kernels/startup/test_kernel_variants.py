"""Start-up builds every Triton kernel variant serving can meet (issue 20), checked on the CPU.

The launchers run on CPU tensors with each kernel's `run` replaced by a recorder that computes the launch's cache key
with the installed Triton's own binder (`create_function_from_signature` + `native_specialize_impl`, the code
`JITFunction.run` uses to decide whether to compile): the keys of launches shaped as serving makes them (any batch
size, sequence, prefix and token count, index vectors at any offset) must be among the keys of the launches the
warm-up plan makes. The enumerations behind the plan are checked against brute force. The GPU test
(tests/runtime/engine/test_cuda.py) counts real compilations."""
from __future__ import annotations

import random
from collections import defaultdict

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from radixlm.runtime.kernels.attention.decode_splits import (  # noqa: E402
    decode_chunk_capacity, decode_num_splits, decode_wide_rows)
from radixlm.runtime.kernels.startup.kernel_variants import (  # noqa: E402
    EXTEND_WARMUP_LENS, TOKEN_ROW_WARMUP, decode_eager_splits, warmup_plan)


class Recorder:
    """kernel name -> the set of cache keys its launches would use (specialization of every argument + options)."""

    def __init__(self, monkeypatch, kernels: dict):
        self.keys: dict[str, set] = defaultdict(set)
        for name, kernel in kernels.items():
            if isinstance(kernel, Autotuner):  # its configs add their constexprs: record the launch's own ones
                def run(*args, grid, warmup, _name=name, **kwargs):
                    self.keys[_name].add(tuple(sorted(kwargs.items())))
            else:
                binder = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)

                def run(*args, grid, warmup, _name=name, _binder=binder, **kwargs):
                    _, spec, options = _binder(*args, **kwargs)
                    self.keys[_name].add((tuple(spec), tuple(sorted(options.items()))))
            monkeypatch.setattr(kernel, "run", run)

    def take(self) -> dict[str, set]:
        out, self.keys = dict(self.keys), defaultdict(set)
        return out


def _assert_covered(warm: dict[str, set], serving: dict[str, set]) -> None:
    for name, keys in serving.items():
        missing = keys - warm.get(name, set())
        assert not missing, f"{name}: {len(missing)} variant(s) built only while serving, e.g. {next(iter(missing))}"


# ------------------------------------------------------------------------------------------------ enumerations
@pytest.mark.parametrize("context_len", [1, 200, 256, 257, 2048, 4100])
@pytest.mark.parametrize("kv_heads", [1, 2, 8, 32])
@pytest.mark.parametrize("graph_max_bs", [0, 1, 8, 24, 512])
def test_decode_eager_splits_is_every_split_count_of_an_eager_pass(context_len, kv_heads, graph_max_bs):
    lengths = sorted({1, context_len, *range(1, context_len + 1, 97), *range(255, context_len + 1, 256),
                      *range(256, context_len + 1, 256), *range(257, context_len + 1, 256)})
    seen = {decode_num_splits(n, bs, kv_heads) for n in lengths if n <= context_len
            for bs in range(graph_max_bs + 1, graph_max_bs + 300)}
    assert decode_eager_splits(context_len, kv_heads, graph_max_bs) == sorted(seen)


def test_warmup_plan_follows_graphs_and_media():
    # Llama-3.1-8B shapes, default graphs (512 rows): eager decode passes have more than 512 rows, one split.
    assert warmup_plan(4096, 8, 512, False, False).decode_splits == [1]
    # No graphs, or a model whose prompt passes run eagerly at any size: every split count up to the cap.
    assert warmup_plan(4096, 8, 0, False, False).decode_splits == list(range(1, 17))
    assert warmup_plan(4096, 8, 512, True, False).decode_splits == list(range(1, 17))
    assert warmup_plan(2048, 2, 8, False, True).decode_splits == list(range(1, 9))
    assert warmup_plan(2048, 2, 8, False, True).moe
    assert TOKEN_ROW_WARMUP == (1, 2, 3, 4)
    # The tensor-core GEMM's BLOCK_Ms (16, 32 rows), then one wide eager pass (decode_wide_rows: 128 rows at 8 kv
    # heads) where eager decode passes can be that wide.
    rows = TOKEN_ROW_WARMUP + (16, 32)
    assert warmup_plan(4096, 8, 512, False, False).token_row_batches == rows + (128,)
    assert warmup_plan(4096, 8, 512, False, False, max_rows=2048).token_row_batches == rows + (128,)
    assert warmup_plan(4096, 8, 512, False, False, max_rows=512).token_row_batches == rows  # all graphs
    assert warmup_plan(4096, 8, 0, False, False, max_rows=127).token_row_batches == rows
    assert warmup_plan(4096, 8, 0, False, False, max_rows=128).token_row_batches == rows + (128,)
    assert warmup_plan(4096, 2, 8, False, False, max_rows=600).token_row_batches == rows + (512,)
    assert warmup_plan(4096, 8, 0, False, False, max_rows=12).token_row_batches == TOKEN_ROW_WARMUP + (12,)
    # The decode stages' split passes: one request per split count past one, then the fewest rows of an unchunked
    # eager pass of 2+ rows (33 at 2 kv heads: fewer are chunked) at each split count it reaches.
    assert warmup_plan(4096, 2, 0, False, False).split_passes == (
        [(1, 256 * (s - 1) + 1) for s in range(2, 17)] + [(33, 256 * (s - 1) + 1) for s in range(1, 5)])
    assert warmup_plan(4096, 2, 0, False, False, max_rows=32).split_passes == [
        (1, 256 * (s - 1) + 1) for s in range(2, 17)]
    assert warmup_plan(4096, 8, 512, False, False).split_passes == [(513, 1)]


@pytest.mark.parametrize("top_k, n_local", [(8, 128), (2, 8), (4, 60), (1, 4), (8, 16)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("max_tokens", [1, 40, 8192, 20000])
def test_reachable_moe_configs_are_every_config_of_a_pass(top_k, n_local, dtype, max_tokens):
    from radixlm.runtime.kernels.moe.fused_moe import TRITON_CHUNK_TOKENS, pick_config, reachable_configs

    seen = {pick_config(t * top_k, n_local, dtype) for t in range(1, min(max_tokens, TRITON_CHUNK_TOKENS) + 1)}
    assert set(reachable_configs(max_tokens, top_k, n_local, dtype)) == seen


# ------------------------------------------------------------------------------------------------ attention
def _pools(slots=600, kv_heads=2, head_dim=16, rows=9, width=4100):
    k_buf = torch.zeros(slots, kv_heads, head_dim)
    return k_buf, k_buf.clone(), torch.zeros(rows, width, dtype=torch.int64)


def _qkv_q(bs, heads, kv_heads, head_dim):
    """q as the model hands it over: the first part of the fused qkv rows, reshaped to (bs, heads, head_dim)."""
    qkv = torch.zeros(bs, (heads + 2 * kv_heads) * head_dim)
    return qkv[:, : heads * head_dim].reshape(bs, heads, head_dim)


def _index(values, offset):
    """An int64 index vector starting `offset` elements into a larger one (views of host-copied rows)."""
    buf = torch.zeros(offset + len(values), dtype=torch.int64)
    buf[offset:] = torch.tensor(values)
    return buf[offset:]


def _launch_as_sm90(monkeypatch, module) -> None:
    """module's launches take the PDL options sm_90 gives them (PDL at up to PDL_MAX_ROWS rows), on the CPU."""
    from radixlm.runtime.kernels.pdl import PDL_MAX_ROWS

    monkeypatch.setattr(module, "pdl_options", lambda device, rows: (
        {"PDL": True, "launch_pdl": True} if rows <= PDL_MAX_ROWS else {"PDL": False}))


@pytest.mark.parametrize("kv_heads, graph_max_bs, pool_dtype", [
    (2, 8, torch.float32), (2, 0, torch.float32), (8, 512, torch.float32), (1, 4, torch.float32),
    (8, 512, torch.float8_e4m3fn), (2, 0, torch.float8_e5m2)])  # a float8 pool: its own launch configs
@pytest.mark.parametrize("pdl", [False, True])
def test_decode_launches_while_serving_are_built_by_the_warm_up(monkeypatch, kv_heads, graph_max_bs, pool_dtype, pdl):
    """pdl: launched as on sm_90, where one-row passes take their own (PDL) variants."""
    from radixlm.runtime.executor.cuda_graph_runner import capture_batch_sizes
    from radixlm.runtime.kernels.attention import decode as da
    from radixlm.runtime.kernels.attention import decode_work as dw
    from radixlm.runtime.kernels.pdl import PDL_MAX_ROWS

    if pdl:
        _launch_as_sm90(monkeypatch, da)
    heads, head_dim, context_len = 4 * kv_heads, 16, 4096
    rec = Recorder(monkeypatch, {"stage1": da._decode_stage1, "stage2": da._decode_stage2, "work": dw._decode_work})
    k_buf, v_buf, req_to_token = _pools(kv_heads=kv_heads)
    k_buf, v_buf = k_buf.to(pool_dtype), v_buf.to(pool_dtype)

    def launch(bs, seq_lens, offset=0, num_splits=None):
        rows = _index([0] * bs, offset)
        lens = _index(seq_lens, offset + 1)
        da.decode_attention(_qkv_q(bs, heads, kv_heads, head_dim), k_buf, v_buf, req_to_token, rows, lens, 0.25,
                            max(seq_lens), num_splits)

    # The warm-up's eager passes (kernels.startup.warm_up_kernels) and the captured graphs' fixed split counts.
    plan = warmup_plan(context_len, kv_heads, graph_max_bs, False, False)
    for bs in plan.token_row_batches:
        launch(bs, [1] * bs)
    for bs, seq_len in plan.split_passes:
        launch(bs, [seq_len] * bs)
    if graph_max_bs:
        for bs in capture_batch_sizes(graph_max_bs):
            launch(bs, [1] * bs, num_splits=decode_num_splits(context_len, bs, kv_heads))
    warm = rec.take()
    # Stage 1's variants: split (partials for stage 2), DIRECT (one split), wide (DIRECT, its own launch config
    # where the pool's dtype has one) where a pass reaches decode_wide_rows, and chunked where one is chunked; the
    # split count itself builds none.
    from radixlm.runtime.kernels.attention.decode_splits import KvPool, decode_kernel_config

    pool = KvPool.of(k_buf.dtype)
    own_wide = decode_kernel_config(pool, True) != decode_kernel_config(pool, False)
    launched = ([(bs, decode_num_splits(1, bs, kv_heads)) for bs in plan.token_row_batches]
                + [(bs, decode_num_splits(n, bs, kv_heads)) for bs, n in plan.split_passes]
                + [(bs, decode_num_splits(context_len, bs, kv_heads))
                   for bs in (capture_batch_sizes(graph_max_bs) if graph_max_bs else [])])

    def variant(bs, splits):
        if decode_chunk_capacity(bs, kv_heads):
            return "chunked"
        if own_wide and bs >= decode_wide_rows(kv_heads):
            return "wide"
        return ("split" if splits > 1 else "direct", pdl and bs <= PDL_MAX_ROWS)

    assert len(warm["stage1"]) == len({variant(bs, splits) for bs, splits in launched})
    # Serving: eager passes of more rows than the largest graph, any lengths, index vectors at any offset.
    rng = random.Random(0)
    for i in range(60):
        bs = rng.randrange(graph_max_bs + 1, graph_max_bs + 40)
        if i % 4 == 0:  # wide passes
            bs = max(graph_max_bs + 1, decode_wide_rows(kv_heads)) + rng.randrange(0, 20)
        lens = [rng.randrange(1, context_len + 1) for _ in range(bs)]
        if rng.random() < 0.3:
            lens = [rng.randrange(1, 300) for _ in range(bs)]
        launch(bs, lens, offset=rng.randrange(0, 5))
    _assert_covered(warm, rec.take())


def test_extend_launches_while_serving_are_built_by_the_warm_up(monkeypatch):
    from radixlm.runtime.kernels.attention import extend as ea

    heads, kv_heads, head_dim = 8, 2, 16
    rec = Recorder(monkeypatch, {"extend": ea._extend_kernel})
    k_buf, v_buf, req_to_token = _pools(kv_heads=kv_heads)

    def launch(prefix, extend, offset=0):
        n, bs = sum(extend), len(extend)
        qkv = torch.zeros(n, (heads + 2 * kv_heads) * head_dim)
        q = qkv[:, : heads * head_dim].reshape(n, heads, head_dim)
        starts = [sum(extend[:i]) for i in range(bs)]
        ea.extend_attention(q, k_buf, v_buf, req_to_token, _index([0] * bs, offset), _index(prefix, offset + 1),
                            _index(extend, offset + 2), _index(starts, offset + 3), 0.25, max(extend))

    for lens in EXTEND_WARMUP_LENS:
        launch([0] * len(lens), list(lens))
    warm = rec.take()
    rng = random.Random(1)
    for _ in range(60):
        bs = rng.randrange(1, 12)
        launch([rng.choice([0, 1, 16, 2048, rng.randrange(0, 3000)]) for _ in range(bs)],
               [rng.choice([1, 2, 15, 16, 17, 64, rng.randrange(1, 600)]) for _ in range(bs)], rng.randrange(0, 5))
    _assert_covered(warm, rec.take())


def test_tree_mask_launches_while_serving_are_built_by_the_warm_up(monkeypatch):
    """Tree drafts' passes (the extend kernel's USE_CUSTOM_MASK) through TritonAttnBackend, as ForwardBatch.build
    makes them: built by the warm-up's masked passes (ModelRunner.warmup_extend_batch) when tree drafts are
    configured; passes without masks build the same variants as without tree drafts."""
    from types import SimpleNamespace

    from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode, ModelWorkerBatch
    from radixlm.runtime.executor.logits import LogitsPlan
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.spec.tree import TreeMask, verify_mask
    from radixlm.runtime.layers.attention.triton_backend import TritonAttnBackend
    from radixlm.runtime.kernels.attention import extend as ea
    from radixlm.runtime.kernels.startup.kernel_variants import uses_tree_masks

    heads, kv_heads, head_dim = 8, 2, 16
    rec = Recorder(monkeypatch, {"extend": ea._extend_kernel})
    backend = TritonAttnBackend(SimpleNamespace(model_config=SimpleNamespace(context_len=4096), num_kv_heads=kv_heads))
    runner = SimpleNamespace(device="cpu", req_to_token_pool=ReqToTokenPool(9, 4100),
                             token_to_kv_pool=TokenToKVPool(600, 1, torch.float32, 1, kv_heads, head_dim, "cpu"),
                             attn_backend=backend)
    layer = SimpleNamespace(layer_id=0, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, scaling=0.25)

    def run(fb):
        qkv = torch.zeros(fb.num_tokens, (heads + 2 * kv_heads) * head_dim)
        backend.init_forward_metadata(fb)
        backend.forward_extend(qkv[:, : heads * head_dim], None, None, layer, fb, save_kv_cache=False)

    def warm_up(tree_masks):
        for masked in (False, True) if tree_masks else (False,):
            for lens in EXTEND_WARMUP_LENS:
                run(ModelRunner.warmup_extend_batch(runner, list(lens), masked))
        return rec.take()

    plain, warm = warm_up(False), warm_up(True)
    assert plain["extend"] < warm["extend"] and len(warm["extend"]) == 2 * len(plain["extend"]) == 4
    rng = random.Random(4)
    for _ in range(40):
        bs = rng.randrange(1, 8)
        prefix, ext, trees = [], [], []
        for i in range(bs):
            p = rng.choice([0, 1, 16, rng.randrange(0, 3000)])
            kind = rng.choice(["tree", "tree", "head", "none"])
            if kind == "none":  # a prefill chunk or a chain draft beside the trees
                e, tree = rng.choice([1, 2, 17, rng.randrange(1, 300)]), None
            elif kind == "tree":  # a verification pass: rows before the root, the root, the nodes
                nodes = rng.randrange(1, 70)
                parents = [rng.randrange(-1, j) if rng.random() < 0.5 else j - 1 for j in range(nodes)]
                parents = sorted(parents)  # a tree in depth order whatever it is: parents[j] < j stays true
                before = rng.randrange(1, 4)
                e, tree = before + nodes, TreeMask(p, verify_mask(parents, before))
            else:  # an EAGLE head's tree step: the mask starts inside the prefix
                e, gap = rng.randrange(1, 9), min(p, rng.randrange(0, 40))
                tree = TreeMask(p - gap, torch.ones(e, gap + e, dtype=torch.bool))
            prefix.append(p)
            ext.append(e)
            trees.append(tree)
        if all(t is None for t in trees):
            continue
        n = sum(ext)
        wb = ModelWorkerBatch(input_ids=[0] * n, positions=[0] * n, req_pool_indices=[0] * bs, prefix_lens=prefix,
                              extend_lens=ext, seq_lens=[p + e for p, e in zip(prefix, ext)],
                              out_cache_loc=torch.zeros(n, dtype=torch.int64), logits=LogitsPlan(), tree_masks=trees)
        run(ForwardBatch.build(wb, ForwardMode.REQUEST_SPANS, runner.req_to_token_pool, runner.token_to_kv_pool,
                               backend, "cpu"))
    serving = rec.take()
    assert serving["extend"] - plain["extend"]  # the masked variants were met
    _assert_covered(warm, serving)
    # The warm-up plans the masked passes only where serving meets them.
    eagle = SimpleNamespace(speculative_algorithm=SimpleNamespace(is_eagle=True), speculative_eagle_topk=4)
    assert uses_tree_masks(eagle, True)
    assert not uses_tree_masks(eagle, False)  # a backend without masks: chains
    assert not uses_tree_masks(SimpleNamespace(speculative_algorithm=SimpleNamespace(is_eagle=True),
                                               speculative_eagle_topk=1), True)
    assert not uses_tree_masks(SimpleNamespace(speculative_algorithm=None, speculative_eagle_topk=1), True)
    assert warmup_plan(4096, 8, 512, False, False, tree_masks=True).tree_masks
    assert not warmup_plan(4096, 8, 512, False, False).tree_masks


# ------------------------------------------------------------------------------------------------ elementwise
def test_fused_elementwise_launches_depend_on_nothing_that_varies(monkeypatch):
    from radixlm.runtime.kernels.elementwise import fused_kernels as fk
    from radixlm.runtime.kernels.quant import fp8_prologue
    from radixlm.runtime.layers.activation import SiluAndMul
    from radixlm.runtime.layers.norm import RMSNorm

    rec = Recorder(monkeypatch, {"rmsnorm": fk._rmsnorm_kernel, "silu": fk._silu_and_mul_kernel,
                                 "rotary": fk._rotary_kernel, "store_kv": fk._store_kv_kernel,
                                 "norm_fp8": fp8_prologue._norm_quant_kernel,
                                 "silu_fp8": fp8_prologue._silu_quant_kernel})
    hidden, heads, kv_heads, head_dim, inter = 128, 8, 2, 16, 256
    w, cos_sin = torch.ones(hidden), torch.zeros(4096, head_dim)
    k_buf = torch.zeros(600, kv_heads, head_dim)
    norm = RMSNorm(hidden, 1e-6)
    norm.weight.data = w

    def one_pass(n, offset):
        x = torch.zeros(n, hidden)
        out, res = fk.rmsnorm(x, w, 1e-6, x.clone())
        fk.rmsnorm(x, w, 1e-6)
        qkv = torch.zeros(n, (heads + 2 * kv_heads) * head_dim)
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        fk.rotary_(_index(list(range(n)), offset), q, k, cos_sin, head_dim)
        fk.store_kv(k, v, _index(list(range(1, n + 1)), offset + 1), k_buf, k_buf)
        fk.silu_and_mul(torch.zeros(n, 2 * inter))
        # The FP8 GEMMs' steps with their quantization (fp8_prologue.py: per-token W8A8 layers).
        fp8_prologue.quantized_rows(norm.prologue(x.clone()), x)
        fp8_prologue.quantized_rows(norm.prologue(), x)
        fp8_prologue.quantized_rows(SiluAndMul().prologue(), torch.zeros(n, 2 * inter))

    one_pass(17, 0)  # the warm-up's first pass
    warm = rec.take()
    rng = random.Random(2)
    for n in [1, 2, 3, 4, 5, 16, 32, 333] + [rng.randrange(1, 500) for _ in range(20)]:
        one_pass(n, rng.randrange(0, 5))
    _assert_covered(warm, rec.take())


def test_skinny_gemm_three_rows_run_the_four_row_kernel(monkeypatch):
    from radixlm.runtime.kernels.gemm import skinny_gemm

    rec = Recorder(monkeypatch, {"skinny": skinny_gemm._skinny_kernel})
    w = torch.zeros(64, 32, dtype=torch.bfloat16)
    for m in (1, 2, 3, 4):
        y = skinny_gemm.skinny_linear(torch.ones(m, 32, dtype=torch.bfloat16), w)
        assert y.shape == (m, 64)
    assert {dict(k)["M"] for k in rec.take()["skinny"]} == set(skinny_gemm.SKINNY_ROWS) == {1, 2, 4}


# ------------------------------------------------------------------------------------------------ MoE
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_moe_launches_while_serving_are_built_by_the_warm_up(monkeypatch, dtype):
    from radixlm.runtime.kernels.elementwise import fused_kernels as fk
    from radixlm.runtime.kernels.moe import fused_moe as fm

    rec = Recorder(monkeypatch, {"count": fm._count_kernel, "offsets": fm._offsets_kernel,
                                 "scatter": fm._scatter_kernel, "gemm": fm._grouped_gemm_kernel,
                                 "silu": fk._silu_and_mul_kernel})
    e, k, h, i = 8, 2, 64, 32
    w13, w2 = torch.zeros(e, 2 * i, h, dtype=dtype), torch.zeros(e, h, i, dtype=dtype)

    def launch(t, rng, config=None):
        ids = torch.tensor([rng.sample(range(e), k) for _ in range(t)], dtype=torch.int32)
        fm.fused_experts_triton(torch.zeros(t, h, dtype=dtype), w13, w2, torch.ones(t, k), ids, 0, e, config=config)

    rng = random.Random(3)
    # warmup.warm_up_moe: one token per reachable config.
    for cfg in fm.reachable_configs(fm.TRITON_CHUNK_TOKENS, k, e, dtype):
        launch(1, rng, cfg)
    warm = rec.take()
    for t in [1, 2, 3, 7, 8, 16, 64, 65, 200, 511, 512, 513, 1000] + [rng.randrange(1, 1200) for _ in range(10)]:
        launch(t, rng)
    _assert_covered(warm, rec.take())


@pytest.mark.parametrize("kv_heads, graph_max_bs, context_len", [(2, 8, 4096), (8, 512, 131072), (1, 0, 600),
                                                                 (8, 0, 8192)])
@pytest.mark.parametrize("pdl", [False, True])
def test_shared_prefix_launches_while_serving_are_built_by_the_warm_up(monkeypatch, kv_heads, graph_max_bs,
                                                                       context_len, pdl):
    """Eager decode passes with shared prefixes (shared-prefix decode): the prefix kernel, decode stage 1
    with row starts and stage 2 over splits + prefix splits, built by TritonAttnBackend.warm_up_shared_prefix.
    pdl: launched as on sm_90 (one-row passes take PDL variants)."""
    from types import SimpleNamespace

    from radixlm.runtime.cache.kv_quant import KVScales
    from radixlm.runtime.layers.attention.triton_backend import TritonAttnBackend, shared_prefixes
    from radixlm.runtime.kernels.attention import decode as da
    from radixlm.runtime.kernels.attention import shared_prefix as spa

    if pdl:
        _launch_as_sm90(monkeypatch, da)
    heads, head_dim = 4 * kv_heads, 16
    rec = Recorder(monkeypatch, {"stage1": da._decode_stage1, "stage2": da._decode_stage2,
                                 "prefix": spa._shared_prefix_stage1})
    k_buf, v_buf, req_to_token = _pools(kv_heads=kv_heads)
    plan = warmup_plan(context_len, kv_heads, graph_max_bs, False, False, shared_prefix=True)
    assert plan.shared_prefix and warmup_plan(context_len, kv_heads, graph_max_bs, False, False).shared_prefix == []
    backend = TritonAttnBackend.__new__(TritonAttnBackend)
    backend.model_runner = SimpleNamespace(
        token_to_kv_pool=SimpleNamespace(get_key_buffer=lambda i: k_buf, get_value_buffer=lambda i: v_buf,
                                         kv_scales=lambda i: KVScales()),
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token), model_config=SimpleNamespace(dtype=k_buf.dtype))
    backend.warm_up_shared_prefix(SimpleNamespace(layer_id=0, num_heads=heads, head_dim=head_dim, scaling=0.25),
                                  plan.shared_prefix)
    for bs, n in plan.split_passes:  # the plain passes' stage 2 (warm_up_kernels' eager passes)
        da.decode_attention(_qkv_q(bs, heads, kv_heads, head_dim), k_buf, v_buf, req_to_token, _index([0] * bs, 0),
                            _index([n] * bs, 1), 0.25, n)
    warm = rec.take()
    rng = random.Random(2)
    for _ in range(80):
        bs = rng.randrange(max(graph_max_bs + 1, 2), graph_max_bs + 300)
        lens = [rng.randrange(2, context_len + 1) for _ in range(bs)]
        rows = list(range(bs))
        rng.shuffle(rows)
        groups, at = [], 0
        while at < bs - 1 and rng.random() < 0.8:
            n = rng.randrange(2, min(bs - at, 70) + 1)
            member = rows[at : at + n]
            prefix = rng.randrange(1, min(lens[r] for r in member))
            groups.append((prefix, member))
            at += n
        if not groups:
            continue
        offset = rng.randrange(0, 5)
        da.decode_attention(_qkv_q(bs, heads, kv_heads, head_dim), k_buf, v_buf, req_to_token,
                            _index([0] * bs, offset), _index(lens, offset + 1), 0.25, max(lens), None,
                            shared_prefixes(groups, bs, heads // kv_heads, kv_heads, "cpu"))
    serving = rec.take()
    assert serving["prefix"] and serving["stage1"]
    _assert_covered(warm, serving)
