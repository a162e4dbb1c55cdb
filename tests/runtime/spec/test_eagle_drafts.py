"""--speculative-algorithm EAGLE through the real Scheduler: a random-weight EAGLE head in the published EAGLE-1
checkpoint layout over a tiny random-weight Llama (float32, CPU). Every draft the head proposes equals the chain a
from-scratch reference computes (plain torch over transformers' hidden states: pairs (h_i, t_{i+1}), then its own
outputs), across chunked prefill, pages, retraction and repeated prompts -- so its KV, written after each pass, is
right wherever it is read; outputs equal those without speculation and the KV accounting holds after every step.
Random heads draft badly: their speed needs trained heads, which are not available offline."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from radixlm.runtime.spec.sources.model import EagleSource
from tests.runtime.models.tiny import save_tiny

from tests.runtime.scheduler.conftest import TINY_LLAMA, request
from tests.runtime.scheduler.fake_runner import make_prompts
from tests.runtime.scheduler.fake_serving import serve
from .test_standalone_drafts import make

H, INTER, HEADS, KV_HEADS = TINY_LLAMA["hidden_size"], TINY_LLAMA["intermediate_size"], 4, 2
HD = H // HEADS

MODES = [
    pytest.param({}, 0, id="default"),
    pytest.param({"page_size": 4}, 0, id="page4"),
    pytest.param({"chunked_prefill_size": 8}, 2, id="chunked8"),
    pytest.param({"overlap_schedule": "on", "speculative_max_batch_rows": 5}, 1, id="overlap-batch-rule"),
    pytest.param({"max_total_tokens": 128, "schedule_conservativeness": 0.05}, 0, id="retraction"),
]


def _head_weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    attn = {"q_proj": r(H, H), "k_proj": r(KV_HEADS * HD, H), "v_proj": r(KV_HEADS * HD, H), "o_proj": r(H, H)}
    mlp = {"gate_proj": r(INTER, H), "up_proj": r(INTER, H), "down_proj": r(H, INTER)}
    return {"fc.weight": r(H, 2 * H), "fc.bias": r(H), "layers.0.post_attention_layernorm.weight": 1 + r(H),
            **{f"layers.0.self_attn.{k}.weight": v for k, v in attn.items()},
            **{f"layers.0.mlp.{k}.weight": v for k, v in mlp.items()}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    target, head = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("eagle")
    hf = save_tiny(LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "architectures"}), target)
    weights = _head_weights(5)
    save_file(weights, str(head / "model.safetensors"))
    (head / "config.json").write_text(json.dumps({**TINY_LLAMA, "num_hidden_layers": 1}))
    return {"target": str(target), "head": str(head)}, hf, weights


# ---------------------------------------------------------------------- the reference
def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    inv = 1.0 / (TINY_LLAMA["rope_theta"] ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    ang = torch.cat([pos[:, None].float() * inv] * 2, dim=-1)
    half = torch.cat([-x[..., HD // 2 :], x[..., : HD // 2]], dim=-1)
    return x * ang.cos()[:, None] + half * ang.sin()[:, None]


def _reference_head(w, embed: torch.Tensor, features: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """EAGLE-1's head over pairs (features[i], tokens[i]) at positions 0..n-1: fc, then one decoder layer
    without an input norm (causal GQA attention, post-attention RMSNorm, SiLU MLP), no final norm."""
    n = len(tokens)
    x = torch.cat([embed[tokens], features], dim=-1) @ w["fc.weight"].T + w["fc.bias"]
    pos = torch.arange(n)
    q = _rope((x @ w["layers.0.self_attn.q_proj.weight"].T).view(n, HEADS, HD), pos)
    k = _rope((x @ w["layers.0.self_attn.k_proj.weight"].T).view(n, KV_HEADS, HD), pos)
    v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(n, KV_HEADS, HD)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / HD**0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    a = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, H) @ w["layers.0.self_attn.o_proj.weight"].T
    h = a + x
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + TINY_LLAMA["rms_norm_eps"])
    normed = normed * w["layers.0.post_attention_layernorm.weight"]
    gate, up = normed @ w["layers.0.mlp.gate_proj.weight"].T, normed @ w["layers.0.mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w["layers.0.mlp.down_proj.weight"].T + h


def reference_chain(hf, w, tokens: list[int], k: int) -> list[int]:
    """The k tokens EAGLE drafts after `tokens`: the target's final hidden states h_0 .. h_{m-1} paired with
    t_1 .. t_m, then each output paired with the token it gave."""
    with torch.no_grad():
        hidden = hf.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
        embed, lm_head = hf.model.embed_tokens.weight, hf.lm_head.weight
        features, pair_tokens, draft = hidden, list(tokens[1:]), []
        for _ in range(k):
            out = _reference_head(w, embed, features, pair_tokens)[-1]
            draft.append(int(torch.argmax(out @ lm_head.T)))
            features, pair_tokens = torch.cat([features, out[None]]), pair_tokens + [draft[-1]]
    return draft


def _record(sched) -> list[tuple[list[int], list[int]]]:
    source = next(s for s in sched.drafts.sources if isinstance(s, EagleSource))
    seen, propose = [], source.propose_batch

    def recording(reqs, limits):
        propose(reqs, limits)
        seen.extend((r.origin_input_ids + r.output_ids, list(r.kv.draft.tokens)) for r in reqs
                    if r.kv.draft is not None)

    source.propose_batch = recording
    return seen


def _eagle(paths, **kw):
    return make({"target": paths["target"]}, None, speculative_algorithm="EAGLE",
                speculative_draft_model_path=paths["head"], speculative_num_draft_tokens=4, **kw)


def _requests(seed: int):
    prompts = make_prompts(seed, 5, lo=10, hi=30)
    prompts.append(prompts[0])  # a repeated prompt: a cache hit whose pairs continue as the writer's did
    return [request(f"r{i}", p, max_new_tokens=9 + i) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("kwargs, every", MODES)
def test_drafts_equal_the_reference_chain_and_outputs_are_unchanged(setup, kwargs, every):
    paths, hf, weights = setup
    expected = serve(make({"target": paths["target"]}, None, **kwargs), _requests(81), every)
    sched = _eagle(paths, **kwargs)
    seen = _record(sched)
    got = serve(sched, _requests(81), every)
    assert {k: v["output_ids"] for k, v in got.items()} == {k: v["output_ids"] for k, v in expected.items()}
    assert len(seen) >= (1 if "speculative_max_batch_rows" in kwargs else 6)  # the batch rule: few drafts
    for tokens, draft in seen:
        assert draft == reference_chain(hf, weights, tokens, len(draft)), tokens
    sched.check_memory()
    if "max_total_tokens" in kwargs:
        assert sched.stats["retractions"] > 0


def test_target_passes_replayed_as_graphs(setup):
    """The target's one-row-per-token passes (mixed prefill and verification rows among them) and the head's chain
    steps replay graphs -- here their eager stand-ins: the head reads the hidden states the target's replay left in
    its buffer, and its chain steps take their features from a static buffer."""
    from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner

    paths, hf, weights = setup
    expected = serve(make({"target": paths["target"]}, None), _requests(83), 1)
    sched = _eagle(paths)
    sched.runner.graph_runner = CudaGraphRunner(sched.runner, 32, use_graphs=False)
    head = next(s.runner for s in sched.drafts.sources if isinstance(s, EagleSource))
    head.capture_chain_graphs(32, use_graphs=False)
    replays, replay = [], head.chain_graphs.replay
    head.chain_graphs.replay = lambda fb: (replays.append(fb.batch_size), replay(fb))[1]
    seen = _record(sched)
    got = serve(sched, _requests(83), 1)
    assert {k: v["output_ids"] for k, v in got.items()} == {k: v["output_ids"] for k, v in expected.items()}
    assert sched.stats["mixed_batches"] > 0 and len(seen) >= 6 and replays
    for tokens, draft in seen:
        assert draft == reference_chain(hf, weights, tokens, len(draft)), tokens


def test_pairs_written_with_wrong_tokens_are_caught(setup, monkeypatch):
    """Mutation: the pairs of a pass written with other tokens than the next ones -- the reference tells."""
    from radixlm.runtime.spec.runners import eagle as eagle_runner

    paths, hf, weights = setup
    catch_up = eagle_runner.EagleRunner.catch_up

    def shifted(self, wb, spans):
        for s in spans:
            s.tokens = [t - 1 if t > 3 else t + 1 for t in s.tokens]
        return catch_up(self, wb, spans)

    monkeypatch.setattr(eagle_runner.EagleRunner, "catch_up", shifted)
    sched = _eagle(paths)
    seen = _record(sched)
    serve(sched, _requests(82))
    assert any(draft != reference_chain(hf, weights, tokens, len(draft)) for tokens, draft in seen)


def test_kv_budget_counts_the_head(setup):
    from radixlm.runtime.spec.budget import draft_budget

    paths, _, _ = setup
    sched = _eagle(paths)
    runner = next(s.runner for s in sched.drafts.sources if isinstance(s, EagleSource))
    budget = draft_budget(sched.args, sched.runner.model_config)
    assert budget.weight_bytes == 4 * sum(p.numel() for p in runner.model.parameters() if p.dim() > 1)
    assert budget.kv_bytes_per_token == runner.kv_bytes_per_token() == 2 * KV_HEADS * HD * 4  # one layer


def test_cache_hits_that_continue_otherwise_keep_outputs(setup):
    """Requests whose cached prefix another request continued otherwise (the caveat in eagle_runner.py: one pair
    at the prefix's end is the writer's) and answers asked again: outputs equal those without speculation."""
    from .test_standalone_drafts import _waves

    paths, _, _ = setup
    runs = []
    for sched in (make({"target": paths["target"]}, None), _eagle(paths)):
        first, again = _waves(84)
        res = serve(sched, first)
        res.update(serve(sched, again))
        sched.check_memory()
        runs.append({k: v["output_ids"] for k, v in res.items()})
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kw, drafted", [
    pytest.param({"speculative_num_draft_tokens": 3}, 2, id="N3"),
    # A user's SGLang command line: --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
    pytest.param({"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}, 3,
                 id="sglang-command"),
    pytest.param({"speculative_num_steps": 2, "speculative_num_draft_tokens": 6}, 2, id="topk1-adjusted"),
    pytest.param({}, 4, id="default"),
])
def test_num_draft_tokens_counts_the_verified_token(setup, kw, drafted):
    """SGLang's --speculative-num-draft-tokens N: the verify pass holds N tokens of a request, the root (its newest)
    among them, so the head's chain is N - 1 tokens; with topk 1, N is --speculative-num-steps + 1; unset, 5."""
    paths, hf, weights = setup
    sched = make({"target": paths["target"]}, None, speculative_algorithm="EAGLE",
                 speculative_draft_model_path=paths["head"], **kw)
    assert sched.args.speculative_num_draft_tokens == drafted + 1
    seen = _record(sched)
    serve(sched, _requests(84))
    assert seen and max(len(draft) for _, draft in seen) == drafted
    tokens, draft = seen[0]
    assert draft == reference_chain(hf, weights, tokens, len(draft))
    sched.check_memory()
