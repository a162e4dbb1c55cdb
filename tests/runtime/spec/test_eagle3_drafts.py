"""--speculative-algorithm EAGLE with an EAGLE-3 head (random weights, published layout: fc over three target layers'
states, midlayer with input and hidden norms, its own norm and lm_head over a draft vocabulary mapped by d2t) over
a tiny 6-layer random Llama: every draft equals a from-scratch reference chain over transformers' hidden states of
layers 2, 3, 3 (the default for 6 layers), and outputs equal those without speculation."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.spec.tree import row_tokens
from radixlm.runtime.spec.sources.model import EagleSource
from tests.runtime.models.tiny import save_tiny

from tests.runtime.scheduler.conftest import TINY_LLAMA
from tests.runtime.scheduler.fake_serving import serve
from .test_eagle_drafts import HD, HEADS, KV_HEADS, _record, _requests, _rope
from .test_standalone_drafts import make

H, INTER, DRAFT_VOCAB, EPS = TINY_LLAMA["hidden_size"], TINY_LLAMA["intermediate_size"], 256, TINY_LLAMA["rms_norm_eps"]
TARGET = {k: v for k, v in TINY_LLAMA.items() if k != "architectures"} | {"num_hidden_layers": 6}


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    m = "midlayer."
    return {
        "fc.weight": r(H, 3 * H), f"{m}input_layernorm.weight": 1 + r(H), f"{m}hidden_norm.weight": 1 + r(H),
        f"{m}post_attention_layernorm.weight": 1 + r(H), "norm.weight": 1 + r(H), "lm_head.weight": r(DRAFT_VOCAB, H),
        f"{m}self_attn.q_proj.weight": r(H, 2 * H), f"{m}self_attn.k_proj.weight": r(KV_HEADS * HD, 2 * H),
        f"{m}self_attn.v_proj.weight": r(KV_HEADS * HD, 2 * H), f"{m}self_attn.o_proj.weight": r(H, H),
        f"{m}mlp.gate_proj.weight": r(INTER, H), f"{m}mlp.up_proj.weight": r(INTER, H),
        f"{m}mlp.down_proj.weight": r(H, INTER),
        "d2t": torch.randint(0, TINY_LLAMA["vocab_size"] - DRAFT_VOCAB, (DRAFT_VOCAB,), generator=g),
        "t2d": torch.zeros(TINY_LLAMA["vocab_size"], dtype=torch.bool),
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    target, head = tmp_path_factory.mktemp("target6"), tmp_path_factory.mktemp("eagle3")
    hf = save_tiny(LlamaConfig(**TARGET), target)
    weights = _weights(7)
    save_file(weights, str(head / "model.safetensors"))
    (head / "config.json").write_text(json.dumps({**TINY_LLAMA, "num_hidden_layers": 1, "draft_vocab_size": DRAFT_VOCAB,
                                                  "architectures": ["LlamaForCausalLMEagle3"]}))
    return {"target": str(target), "head": str(head)}, hf, weights


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _reference_head(w, embed, hidden: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    m, n = "midlayer.", len(tokens)
    x = torch.cat([_rms(embed[tokens], w[f"{m}input_layernorm.weight"]), _rms(hidden, w[f"{m}hidden_norm.weight"])], -1)
    pos = torch.arange(n)
    q = _rope((x @ w[f"{m}self_attn.q_proj.weight"].T).view(n, HEADS, HD), pos)
    k = _rope((x @ w[f"{m}self_attn.k_proj.weight"].T).view(n, KV_HEADS, HD), pos)
    v = (x @ w[f"{m}self_attn.v_proj.weight"].T).view(n, KV_HEADS, HD)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / HD**0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    a = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, H) @ w[f"{m}self_attn.o_proj.weight"].T
    h = a + hidden
    normed = _rms(h, w[f"{m}post_attention_layernorm.weight"])
    gate, up = normed @ w[f"{m}mlp.gate_proj.weight"].T, normed @ w[f"{m}mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[f"{m}mlp.down_proj.weight"].T + h


def reference_chain(hf, w, tokens: list[int], k: int) -> list[int]:
    with torch.no_grad():
        states = hf.model(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        hidden = torch.cat([states[2][0], states[3][0], states[3][0]], dim=-1) @ w["fc.weight"].T
        embed, pair_tokens, draft = hf.model.embed_tokens.weight, list(tokens[1:]), []
        for _ in range(k):
            out = _reference_head(w, embed, hidden, pair_tokens)[-1]
            d = int(torch.argmax(_rms(out, w["norm.weight"]) @ w["lm_head.weight"].T))
            draft.append(d + int(w["d2t"][d]))
            hidden, pair_tokens = torch.cat([hidden, out[None]]), pair_tokens + [draft[-1]]
    return draft


@pytest.mark.parametrize("kwargs, every, graphs", [
    pytest.param({}, 0, False, id="default"),
    pytest.param({"page_size": 4, "chunked_prefill_size": 8}, 2, False, id="page4-chunked8"),
    pytest.param({}, 1, True, id="graph-rows"),
])
def test_eagle3_drafts_equal_the_reference_chain(setup, kwargs, every, graphs):
    paths, hf, weights = setup
    expected = serve(make({"target": paths["target"]}, None, **kwargs), _requests(91), every)
    sched = make({"target": paths["target"]}, None, speculative_algorithm="EAGLE3", speculative_num_draft_tokens=4,
                 speculative_draft_model_path=paths["head"], **kwargs)
    if graphs:  # the graph runners' eager stand-ins: the hooks run in the target's padded passes
        sched.runner.graph_runner = CudaGraphRunner(sched.runner, 32, use_graphs=False)
        next(s.runner for s in sched.drafts.sources if isinstance(s, EagleSource)).capture_chain_graphs(32, False)
    seen = _record(sched)
    got = serve(sched, _requests(91), every)
    assert {k: v["output_ids"] for k, v in got.items()} == {k: v["output_ids"] for k, v in expected.items()}
    assert len(seen) >= 6
    for tokens, draft in seen:
        assert draft == reference_chain(hf, weights, tokens, len(draft)), tokens
    sched.check_memory()
    if graphs:
        assert sched.stats["mixed_batches"] > 0


def reference_topk(hf, w, tokens: list[int], path: list[int], k: int) -> list[int]:
    """The k likeliest tokens the head gives after `tokens` and then the draft tokens `path` (mapped by d2t)."""
    with torch.no_grad():
        states = hf.model(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        hidden = torch.cat([states[2][0], states[3][0], states[3][0]], dim=-1) @ w["fc.weight"].T
        embed, pair_tokens = hf.model.embed_tokens.weight, list(tokens[1:])
        out = _reference_head(w, embed, hidden, pair_tokens)[-1]
        for t in path:
            hidden, pair_tokens = torch.cat([hidden, out[None]]), pair_tokens + [t]
            out = _reference_head(w, embed, hidden, pair_tokens)[-1]
        top = torch.topk(_rms(out, w["norm.weight"]) @ w["lm_head.weight"].T, k).indices.tolist()
    return [d + int(w["d2t"][d]) for d in top]


@pytest.mark.parametrize("graphs", [False, True], ids=["default", "graph-rows"])
def test_eagle3_trees_equal_the_reference_and_keep_outputs(setup, graphs):
    """--speculative-eagle-topk 3: every node is among the reference's top 3 after its path; tree passes run
    eagerly beside the graph runners' padded passes; outputs equal those without speculation."""
    paths, hf, weights = setup
    expected = serve(make({"target": paths["target"]}, None), _requests(93), 1)
    sched = make({"target": paths["target"]}, None, speculative_algorithm="EAGLE3", speculative_num_draft_tokens=6,
                 speculative_num_steps=3, speculative_eagle_topk=3, speculative_draft_model_path=paths["head"])
    if graphs:
        sched.runner.graph_runner = CudaGraphRunner(sched.runner, 32, use_graphs=False)
        next(s.runner for s in sched.drafts.sources if isinstance(s, EagleSource)).capture_chain_graphs(32, False)
    seen = []
    source = next(s for s in sched.drafts.sources if isinstance(s, EagleSource))
    propose = source.propose_batch
    source.propose_batch = lambda reqs, limits: (propose(reqs, limits), seen.extend(
        (r.origin_input_ids + r.output_ids, r.kv.draft) for r in reqs if r.kv.draft is not None))
    got = serve(sched, _requests(93), 1)
    assert {k: v["output_ids"] for k, v in got.items()} == {k: v["output_ids"] for k, v in expected.items()}
    assert len(seen) >= 6 and all(d.parents is not None for _, d in seen)
    for tokens, draft in seen[:6]:
        for i, parent in enumerate(draft.parents):  # each node is among the head's top 3 after its path
            path = row_tokens(draft.tokens, draft.parents, parent + 1)
            assert draft.tokens[i] in reference_topk(hf, weights, tokens, path, 3), (tokens, draft)
    sched.check_memory()


def test_features_from_other_layers_are_caught(setup, monkeypatch):
    """Mutation: the head fed the states entering layers 1, 3, 3 instead of 2, 3, 3 -- the reference tells."""
    from radixlm.runtime.spec.runners import eagle as eagle_runner

    paths, hf, weights = setup
    monkeypatch.setattr(eagle_runner, "aux_layers", lambda cfg, n: [1, 3, 3])
    sched = make({"target": paths["target"]}, None, speculative_algorithm="EAGLE", speculative_num_draft_tokens=4,
                 speculative_draft_model_path=paths["head"])
    seen = _record(sched)
    serve(sched, _requests(92))
    assert any(draft != reference_chain(hf, weights, tokens, len(draft)) for tokens, draft in seen)


def test_kv_budget_counts_the_head(setup):
    from radixlm.runtime.spec.budget import draft_budget

    paths, _, _ = setup
    sched = make({"target": paths["target"]}, None, speculative_algorithm="EAGLE",
                 speculative_draft_model_path=paths["head"])
    runner = next(s.runner for s in sched.drafts.sources if isinstance(s, EagleSource))
    budget = draft_budget(sched.args, sched.runner.model_config)
    assert budget.weight_bytes == 4 * sum(p.numel() for p in runner.model.parameters() if p.dim() > 1)
