"""LoRA's pure parts: --lora-paths and adapter_config.json parsing, the slot table's LRU and pinning, the batched
delta against a per-row loop, tensor-parallel slicing of A and B (ranks' deltas combine to the whole layer's), the
front's registry, and the router's namespaces."""
from __future__ import annotations

import math

import pytest
import torch

from radixlm.router.request_text import routing_text
from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Shard
from radixlm.runtime.lora.config import LoraSpec, LoraTarget, PeftConfig
from radixlm.runtime.lora.layer import LoraLayer, LoraPassContext
from radixlm.runtime.lora.graph import LoraGraphInputs, num_blocks
from radixlm.runtime.kernels.lora import EAGER_BLOCK_ROWS, LoraDecodeConfig
from radixlm.runtime.lora.ops import LoraBatchInfo, add_lora_delta, lora_delta_torch
from radixlm.runtime.lora.registry import LoraRegistry, cache_namespace
from radixlm.runtime.lora.slots import BASE_SLOT, SlotTable


def test_lora_paths_forms():
    assert LoraSpec.parse("a=/x/y") == LoraSpec("a", "/x/y")
    assert LoraSpec.parse("/x/y") == LoraSpec("/x/y", "/x/y")
    assert LoraSpec.parse('{"lora_name": "b", "lora_path": "/p", "pinned": true}') == LoraSpec("b", "/p", True)
    with pytest.raises(ValueError, match="lora_name"):
        LoraSpec.parse('{"lora_path": "/p"}')
    assert ServerArgs(lora_paths=["a=/x"]).enable_lora  # SGLang: --lora-paths turns LoRA on


@pytest.mark.parametrize("kwargs, message", [
    ({"max_lora_rank": 65}, "max_lora_rank"), ({"max_loras_per_batch": 0}, "max_loras_per_batch"),
    ({"max_loras_per_batch": 4, "max_loaded_loras": 2}, "max_loaded_loras"),
    ({"lora_target_modules": ["lm_head"]}, "lora_target_modules"),
])
def test_bad_lora_server_args(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(enable_lora=True, **kwargs)


def test_peft_config_scaling_and_refusals():
    base = {"r": 16, "lora_alpha": 32, "target_modules": ["v_proj", "q_proj"]}
    c = PeftConfig.from_dict(base)
    assert c.scaling == 2.0 and c.target_modules == ("q_proj", "v_proj") and c.targets == {LoraTarget.QKV}
    assert PeftConfig.from_dict({**base, "use_rslora": True}).scaling == 32 / math.sqrt(16)
    assert PeftConfig.from_dict({**base, "target_modules": "all-linear"}).targets == set(LoraTarget)
    for bad, message in [({"r": 65}, "rank"), ({"use_dora": True}, "use_dora"), ({"bias": "all"}, "bias"),
                         ({"target_modules": ["lm_head"]}, "lm_head"), ({"modules_to_save": ["x"]}, "modules_to_save"),
                         ({"peft_type": "IA3"}, "LORA")]:
        with pytest.raises(ValueError, match=message):
            PeftConfig.from_dict({**base, **bad})
    with pytest.raises(ValueError, match="not a directory"):
        PeftConfig.read("/nonexistent/adapter")


def test_slot_table_lru_and_pinning():
    t = SlotTable(2)
    b = t.assign(["a", None, "a", "b"], pinned=set())
    assert b.req_slots[1] == BASE_SLOT and b.req_slots[0] == b.req_slots[2] != b.req_slots[3]
    assert sorted(s for s, _ in b.loads) == [0, 1]
    assert t.assign(["a"], pinned={"b"}).loads == ()  # resident: no swap
    # c needs a slot: b is least recently used but pinned by a running request, so a's goes.
    b2 = t.assign(["c"], pinned={"b"})
    assert b2.loads == ((t.slot_of("c"), "c"),) and t.slot_of("a") is None and t.slot_of("b") is not None
    with pytest.raises(RuntimeError):
        t.assign(["a"], pinned={"b", "c"})
    assert t.fits({"b", None}, "c") and not t.fits({"b", "c"}, "a") and t.fits({"b", "c"}, None)
    t.release("c")
    assert t.slot_of("c") is None and t.assign(["a"], pinned={"b"}).loads[0][1] == "a"
    # A pinned adapter (SGLang's pinned=true) keeps its slot with no request running, and takes one from fits.
    t.pin("b")
    with pytest.raises(ValueError, match="no slot"):
        t.pin("a")
    assert t.assign(["c"], pinned=set()).loads == ((t.slot_of("c"), "c"),) and t.slot_of("b") is not None
    assert t.fits(set(), "c") and not t.fits({"c"}, "a")


def test_batched_delta_equals_a_per_row_loop():
    g = torch.Generator().manual_seed(0)
    slots, width, d_in, d_out = 3, 8, 16, 12
    a, b = torch.randn(slots, width, d_in, generator=g), torch.randn(slots, d_out, width, generator=g)
    scalings = torch.tensor([0.5, 2.0, 1.0])
    req_slots, req_rows = [1, -1, 1, 0, 2, 2], [3, 2, 1, 4, 1, 2]
    info = LoraBatchInfo.build(req_slots, req_rows, scalings, "cpu")
    x = torch.randn(sum(req_rows), d_in, generator=g)
    rows = [s for s, n in zip(req_slots, req_rows) for _ in range(n)]
    want = torch.stack([torch.zeros(d_out) if s < 0 else scalings[s] * (b[s] @ (a[s] @ x[i]))
                        for i, s in enumerate(rows)])
    assert torch.allclose(lora_delta_torch(x, a, b, info), want, atol=1e-5)
    # The kernels' blocks: rows grouped by slot (a slot's requests together, in pass order), base rows left out.
    g = info.blocks
    assert g.block_slots.tolist() == [0, 1, 2] and g.block_lens.tolist() == [4, 4, 3]
    assert g.sorted_rows.tolist()[:11] == [6, 7, 8, 9, 0, 1, 2, 5, 10, 11, 12]
    assert not info.static and info.block_rows == EAGER_BLOCK_ROWS


def test_graph_table_groups_rows_by_slot_in_padded_blocks():
    """The graph form's table (decode kernels): rows by slot in padded blocks of at most block_m, base rows left
    out, unused blocks slot -1, every field sized for the graph; its torch form equals the per-adapter path."""
    config = LoraDecodeConfig(block_m=16)
    rows = [2, -1, 0, 2] + [1] * (config.block_m + 3) + [-1]
    cap = 40
    inputs = LoraGraphInputs(cap, 3, torch.tensor([0.5, 2.0, 1.5]), "cpu", config)
    inputs.fill(rows)
    info = inputs.info(len(rows))
    p = info.padded
    assert info.static and p is not None and p.config == config
    assert p.block_slots.shape[0] == num_blocks(len(rows), 3, 16) and info.row_slots.tolist() == rows
    per_block = p.block_rows.view(-1, 16).tolist()
    blocks = [(s, [r for r in rs if r >= 0]) for s, rs in zip(p.block_slots.tolist(), per_block)]
    assert blocks[:4] == [(0, [2]), (1, list(range(4, 20))), (1, [20, 21, 22]), (2, [0, 3])]
    assert all(s == -1 and not rs for s, rs in blocks[4:])
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 8, 16, generator=gen), torch.randn(3, 12, 8, generator=gen)
    x = torch.randn(len(rows), 16, generator=gen)
    segments = LoraBatchInfo.build(rows, [1] * len(rows), inputs.scalings, "cpu")
    assert torch.allclose(add_lora_delta(torch.zeros(len(rows), 12), x, a, b, info),
                          lora_delta_torch(x, a, b, segments), atol=1e-5)
    with pytest.raises(ValueError, match="exceed"):
        inputs.fill([0] * (cap + 1))


def _tp_layers(target: LoraTarget, tp: int):
    ctx = LoraPassContext()
    out = []
    for rank in range(tp):
        par = Parallel(tp_rank=rank, tp_size=tp)
        if target.row_parallel:
            linear = RowParallelLinear(16, 8, parallel=par)
        else:
            linear = ColumnParallelLinear(16, [Shard.split(8, par, "q"), Shard.split(4, par, "k"),
                                               Shard.split(4, par, "v")])
        out.append(LoraLayer(linear, target, num_slots=1, max_rank=4, context=ctx, tp_rank=rank))  # float32, CPU
    return ctx, out


@pytest.mark.parametrize("target", [LoraTarget.QKV, LoraTarget.O])
def test_tensor_parallel_slices_combine_to_the_whole_delta(target):
    """Column-parallel: each rank's output rows are its slice of the whole delta. Row-parallel: the ranks' partial
    deltas (over their input columns) sum to it, as the all-reduce sums them with the base output."""
    g = torch.Generator().manual_seed(1)
    r = 3
    parts = [(torch.randn(r, 16, generator=g), torch.randn(n, r, generator=g))
             for n in ([8, 4, 4] if target is LoraTarget.QKV else [8])]
    if target is LoraTarget.QKV:
        parts[1] = None  # an adapter that leaves k alone
    x = torch.randn(5, 16, generator=g)
    whole = torch.cat([torch.zeros(5, n) if p is None else x @ p[0].t() @ p[1].t()
                       for p, n in zip(parts, [8, 4, 4] if target is LoraTarget.QKV else [8])], dim=1)
    ctx, (l1,) = _tp_layers(target, 1)
    l1.write(0, parts)
    ctx.info = LoraBatchInfo.build([0], [5], torch.tensor([1.0]), "cpu")
    assert torch.allclose(l1.add(torch.zeros(5, whole.shape[1]), x), whole, atol=1e-5)
    ctx2, ranks = _tp_layers(target, 2)
    ctx2.info = ctx.info
    outs = []
    for rank, layer in enumerate(ranks):
        layer.write(0, parts)
        xs = x[:, rank * 8 : (rank + 1) * 8] if target.row_parallel else x
        outs.append(layer.add(torch.zeros(5, sum(layer.out_sizes)), xs))
    if target.row_parallel:
        assert torch.allclose(outs[0] + outs[1], whole, atol=1e-5)
    else:  # rank 0 holds q[:4], k[:2], v[:2]; rank 1 the rest
        q, k, v = whole.split([8, 4, 4], dim=1)
        for rank, o in enumerate(outs):
            want = torch.cat([q[:, rank * 4 : rank * 4 + 4], k[:, rank * 2 : rank * 2 + 2], v[:, rank * 2 : rank * 2 + 2]], 1)
            assert torch.allclose(o, want, atol=1e-5)


def test_registry_names_ids_and_namespaces():
    reg = LoraRegistry(enabled=True)
    ref = reg.new_ref("sql", "/p")
    with pytest.raises(ValueError, match="loaded already"):
        reg.new_ref("sql", "/q")  # taken while its load runs
    reg.finish_load(ref, True)
    assert reg.resolve("sql") == ref.lora_id and reg.resolve(None) is None
    assert reg.adapter_of_model("sql", "base") == "sql" and reg.adapter_of_model("base:sql", "base") == "sql"
    assert reg.adapter_of_model("base", "base") is None
    for bad in ("nope", 3):
        with pytest.raises(ValueError):
            reg.resolve(bad)
    with pytest.raises(ValueError, match="unknown LoRA adapter"):
        reg.adapter_of_model("base:nope", "base")
    with pytest.raises(ValueError, match="':'"):
        reg.new_ref("a:b", "/p")
    reg.remove("sql")
    again = reg.new_ref("sql", "/p")
    assert again.lora_id != ref.lora_id  # a reload never reads the old adapter's KV
    with pytest.raises(ValueError, match="--enable-lora"):
        LoraRegistry(enabled=False).resolve("sql")
    spaces = {cache_namespace(None, None), cache_namespace("x", None), cache_namespace("y", None),
              cache_namespace("x", "k"), cache_namespace(None, "k")}
    assert len(spaces) == 5


def test_router_keys_by_adapter():
    plain = routing_text("/generate", {"text": "hello"})
    a = routing_text("/generate", {"text": "hello", "lora_path": "a"})
    b = routing_text("/generate", {"text": "hello", "lora_path": ["b"]})
    assert len({plain, a, b}) == 3 and a.endswith("hello")
    assert routing_text("/generate", {"text": "hello world", "lora_path": "a"}).startswith(a)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert routing_text("/v1/chat/completions", {**chat, "model": "a"}) != routing_text("/v1/chat/completions", chat)


@pytest.mark.parametrize("block_rows", [1, 3, 16])
def test_group_rows_blocks_cover_each_adapter_row_once(block_rows):
    """lora/blocks.py: blocks of one slot, at most block_rows rows, each slot's rows in pass order, every adapter row
    in exactly one block, and no more blocks than max_blocks reserves."""
    import numpy as np

    from radixlm.runtime.lora.blocks import group_rows, max_blocks

    rng = np.random.default_rng(block_rows)
    slots = rng.integers(-1, 5, size=90).astype(np.int32)
    slots[10:50] = 2  # a slot over several blocks
    order, starts, lens, block_slots = group_rows(slots, block_rows)
    assert len(starts) <= max_blocks(len(slots), 5, block_rows) and lens.min() >= 1 and lens.max() <= block_rows
    covered = []
    for start, n, slot in zip(starts, lens, block_slots):
        rows = order[start : start + n].tolist()
        assert all(slots[r] == slot for r in rows)
        covered += rows
    assert covered == order.tolist() and sorted(covered) == np.flatnonzero(slots >= 0).tolist()
    for s in range(5):
        mine = [r for r in covered if slots[r] == s]
        assert mine == sorted(mine)
