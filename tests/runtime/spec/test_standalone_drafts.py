"""--speculative-algorithm STANDALONE through the real Scheduler on tiny random-weight Llamas (float32, CPU): a draft
model with the target's own weights (its greedy chain is the target's: nearly every draft token is kept) and a
different, smaller random model (its drafts are mostly rejected). Greedy outputs equal those without speculation in
every scheduling mode -- chunked prefill, pages, overlap, retraction, radix-cache hits of earlier prompts and
answers, the same prompt twice, max_new_tokens, stop tokens and strings inside a draft, an abort -- the KV
accounting holds after every step (enable_integrity_check), and every slot the radix tree holds has the draft
model's own KV for its token in the draft pool (recomputed from scratch)."""
from __future__ import annotations

import itertools

import pytest
import torch
from transformers import LlamaConfig

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.runtime.cache.radix_node import path_to
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.spec.runners.draft_model import DraftModelRunner
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode, ModelWorkerBatch
from radixlm.runtime.executor.logits import LogitsPlan
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.tokenizer import get_tokenizer
from radixlm.runtime.spec.sources.model import DraftModelSource
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.spec.factory import DraftFactory
from tests.runtime.models.tiny import save_tiny

from tests.runtime.scheduler.conftest import TINY_LLAMA, request, run_all
from tests.runtime.scheduler.fake_runner import make_prompts
from tests.runtime.scheduler.fake_serving import serve

SMALL = {**TINY_LLAMA, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1}

MODES = [
    pytest.param({}, 0, id="default"),
    pytest.param({"page_size": 4}, 0, id="page4"),
    pytest.param({"chunked_prefill_size": 16}, 2, id="chunked16"),
    pytest.param({"page_size": 4, "chunked_prefill_size": 8}, 2, id="page4-chunked8"),
    pytest.param({"overlap_schedule": "on"}, 1, id="overlap"),
    # Drafts only while at most 4 requests run: with more, passes launch ahead without drafts (IN_FLIGHT rows
    # mirrored too); with fewer, drafts are made with a pass in flight too (tests/.../test_overlap_drafts.py).
    pytest.param({"overlap_schedule": "on", "speculative_max_batch_rows": 8}, 1, id="overlap-batch-rule"),
    pytest.param({"max_total_tokens": 128, "schedule_conservativeness": 0.05}, 0, id="retraction"),
]


def _config(d: dict) -> LlamaConfig:
    return LlamaConfig(**{k: v for k, v in d.items() if k != "architectures"})


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    torch.set_num_threads(1)
    target, other = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft-small")
    save_tiny(_config(TINY_LLAMA), target, seed=0)
    save_tiny(_config(SMALL), other, seed=1)
    return {"target": str(target), "other": str(other)}


def make(models: dict[str, str], draft: str | None, tokenizer: bool = False, eos: frozenset[int] = frozenset(),
         **kw) -> Scheduler:
    """draft: None (speculation off), "same" (the target's checkpoint) or "other"."""
    kw.setdefault("max_total_tokens", 2048)
    kw.setdefault("speculative_measure_window", 0)  # drafting wherever the source drafts (the tests count it)
    if draft is not None:
        kw.update(speculative_algorithm="STANDALONE", speculative_num_draft_tokens=5,
                  speculative_draft_model_path=models["target" if draft == "same" else draft])
    path = models["target"]
    args = ServerArgs(model_path=path, dtype="float32", device="cpu", enable_integrity_check=True, random_seed=0, **kw)
    config = ModelConfig.from_path(path, dtype="float32", device="cpu")
    runner = ModelRunner(args, config, "cpu")
    return Scheduler(args, runner, tokenizer=get_tokenizer(path) if tokenizer else None, eos_token_ids=eos,
                     drafts=DraftFactory.load(args, runner))


def _waves(seed: int):
    """A first wave (one prompt twice, as n > 1 sends it; max_new_tokens 9..14, mostly inside a 4-token draft),
    then cache hits: the same prompts again with room for more tokens, and with a new tail."""
    prompts = make_prompts(seed, 5, lo=10, hi=30)
    prompts.append(prompts[0])
    first = [request(f"a{i}", p, max_new_tokens=9 + i) for i, p in enumerate(prompts)]
    again = [request(f"b{i}", p if i % 2 else p + [7, 8, 9], max_new_tokens=15) for i, p in enumerate(prompts[:5])]
    return first, again


def _serve_waves(sched: Scheduler, every: int) -> dict:
    first, again = _waves(51)
    res = serve(sched, first, every)
    res.update(serve(sched, again, every))
    sched.check_memory()
    assert sched.is_idle() and sched.tree_cache.protected_size() == 0
    assert sched.req_to_token_pool.available_size() == sched.req_to_token_pool.size
    return {rid: (r["output_ids"], r["finish_reason"]) for rid, r in res.items()}


def _draft_runner(sched: Scheduler) -> DraftModelRunner:
    return next(s.runner for s in sched.drafts.sources if isinstance(s, DraftModelSource))


def _recomputed(runner: DraftModelRunner, tokens: list[int], ps: int) -> TokenToKVPool:
    """The draft model's KV of `tokens` at positions 0.., from scratch: one prefill into a pool of its own (slots
    ps..ps + len(tokens))."""
    pool, n = runner.token_to_kv_pool, len(tokens)
    fresh = TokenToKVPool(n + ps, ps, pool.dtype, pool.num_layers, pool.num_kv_heads, pool.head_dim)
    table = ReqToTokenPool(1, n + 4)
    table.req_to_token[0, :n] = torch.arange(ps, ps + n)
    wb = ModelWorkerBatch(input_ids=tokens, positions=list(range(n)), req_pool_indices=[0], prefix_lens=[0],
                          extend_lens=[n], seq_lens=[n], out_cache_loc=torch.arange(ps, ps + n), logits=LogitsPlan())
    fb = ForwardBatch.build(wb, ForwardMode.REQUEST_SPANS, table, fresh, runner.attn_backend, "cpu")
    with torch.inference_mode():
        runner.attn_backend.init_forward_metadata(fb)
        runner.model(fb.input_ids, fb.positions, fb)
    return fresh


def _assert_slots(runner: DraftModelRunner, tokens: list[int], slots: torch.Tensor, positions: list[int],
                  ps: int) -> None:
    """The draft pool at slots[i] holds the draft model's KV of tokens[positions[i]] after tokens[:positions[i]]."""
    pool, fresh = runner.token_to_kv_pool, _recomputed(runner, tokens, ps)
    at = torch.tensor(positions, dtype=torch.int64)
    for layer in range(pool.num_layers):
        for got, want in zip(pool.get_kv_buffer(layer), fresh.get_kv_buffer(layer)):
            torch.testing.assert_close(got[slots[at]], want[ps + at], atol=1e-4, rtol=1e-4)


def assert_draft_kv_matches_the_tree(sched: Scheduler) -> tuple[int, int]:
    """The draft pool's invariant: every slot the radix tree says has draft KV (a node's first draft_kv_len tokens)
    holds the draft model's KV of its token after its path's tokens -- recomputed here, one prefill per leaf; and
    so does every running request's row below its kv.draft_kv_len. Returns the tree's tokens with draft KV and all
    its tokens."""
    runner, tree, ps = _draft_runner(sched), sched.tree_cache, sched.page_size
    checked = total = 0
    for leaf in (n for n in tree._nodes() if n.is_leaf() and n is not tree.root_node):
        path = path_to(leaf)
        tokens = [t for n in path for t in n.key.token_ids]
        slots = torch.cat([n.value for n in path])
        starts = [0, *itertools.accumulate(len(n.key) for n in path)]
        positions = [p for n, a in zip(path, starts) for p in range(a, a + n.draft_kv_len)]
        if positions:
            _assert_slots(runner, tokens, slots, positions, ps)
    for node in tree._nodes():
        checked, total = checked + node.draft_kv_len, total + len(node.key)
    for req in sched.running:
        n = req.kv.draft_kv_len
        if n and req.req_pool_idx is not None:
            tokens = (req.origin_input_ids + req.output_ids)[:n]
            _assert_slots(runner, tokens, sched.req_to_token_pool.req_to_token[req.req_pool_idx, :n].clone(),
                          list(range(n)), ps)
    return checked, total


def _kept(sched: Scheduler) -> tuple[int, int]:
    return sched.grammar_stats["accepted_draft_tokens"], sched.grammar_stats["draft_tokens"]


@pytest.mark.parametrize("kwargs, every", MODES)
def test_outputs_unchanged_with_a_draft_model(models, kwargs, every):
    off = make(models, None, **kwargs)
    expected = _serve_waves(off, every)
    for draft in ("same", "other"):
        sched = make(models, draft, **kwargs)
        assert _serve_waves(sched, every) == expected, draft
        checked, total = assert_draft_kv_matches_the_tree(sched)
        kept, drafted = _kept(sched)
        stats = sched.grammar_stats
        assert stats["model_drafts"] > 0
        if "speculative_max_batch_rows" not in kwargs:  # no batch rule: the draft model runs every pass
            assert checked == total > 0 and stats["draft_model_skipped_passes"] == 0, (checked, total)
        if draft == "same":
            # The target's own greedy chain: every draft token is kept (float32; rows computed in other layouts may
            # differ in the last bits, hence not strictly all).
            assert kept > 0 and kept >= 0.9 * drafted, (kept, drafted)
        if "max_total_tokens" in kwargs:
            assert sched.stats["retractions"] > 0
        if "speculative_max_batch_rows" in kwargs:
            assert sched.stats["overlapped_batches"] > 0
    if "max_total_tokens" in kwargs:
        assert off.stats["retractions"] > 0


def test_graph_rows(models):
    """As on CUDA: the target's and the draft model's one-row-per-token passes replay (padded) graphs -- here their
    eager stand-ins (use_graphs=False) -- the draft model's mirrored target passes (mixed prefill and verification
    rows among them) and its own draft passes alike."""
    replays = []

    def with_graphs(sched: Scheduler) -> Scheduler:
        runners = [sched.runner] + [s.runner for s in sched.drafts.sources if isinstance(s, DraftModelSource)]
        for runner in runners:
            runner.graph_runner = graph = CudaGraphRunner(runner, 32, use_graphs=False)
            replay = graph.replay
            graph.replay = lambda fb, replay=replay, runner=runner: (replays.append(runner), replay(fb))[1]
        return sched

    expected = _serve_waves(with_graphs(make(models, None)), 1)
    sched = with_graphs(make(models, "same"))
    assert _serve_waves(sched, 1) == expected
    assert_draft_kv_matches_the_tree(sched)
    assert sched.stats["mixed_batches"] > 0  # prompts prefilled beside running drafts, in one replay
    draft = _draft_runner(sched)
    assert replays.count(draft) > sched.grammar_stats["draft_model_passes"]  # its own passes and the target's
    kept, drafted = _kept(sched)
    assert kept > 0 and kept >= 0.9 * drafted, (kept, drafted)


def test_draft_kv_not_written_for_target_passes_loses_acceptance(models, monkeypatch):
    """Mutation: the draft model does not run the target's passes (no draft KV for prompts, cache hits and kept
    tokens); its drafts then continue from garbage and are mostly rejected. Outputs stay exact (verification), but
    acceptance falls: the test above shows the draft pool is kept in step with the target's."""
    monkeypatch.setattr(DraftModelRunner, "write_kv", lambda self, wb: None)
    sched = make(models, "same")
    expected = _serve_waves(make(models, None), 0)
    assert _serve_waves(sched, 0) == expected
    kept, drafted = _kept(sched)
    assert kept < 0.5 * drafted, (kept, drafted)
    with pytest.raises(AssertionError):
        assert_draft_kv_matches_the_tree(sched)


def test_stops_inside_drafts(models):
    """Stop tokens and stop strings met inside a draft end the request there, as without speculation."""
    prompts = make_prompts(52, 4, lo=10, hi=20)
    plain = serve(make(models, None), [request(f"p{i}", p, max_new_tokens=12) for i, p in enumerate(prompts)])
    outs = [plain[f"p{i}"]["output_ids"] for i in range(4)]

    def reqs():
        made = []
        for i, (p, out) in enumerate(zip(prompts, outs)):
            r = request(f"s{i}", p, max_new_tokens=12)
            if i % 2:
                r.sampling_params.stop = [f"t{out[6]}"]
            else:
                r.sampling_params.stop_token_ids = {out[5]}
            made.append(r)
        return made

    expected = serve(make(models, None, tokenizer=True), reqs())
    assert all(r["finish_reason"]["type"] == "stop" for r in expected.values())
    for draft in ("same", "other"):
        sched = make(models, draft, tokenizer=True)
        got = serve(sched, reqs())
        assert {k: (v["output_ids"], v["finish_reason"]) for k, v in got.items()} == \
            {k: (v["output_ids"], v["finish_reason"]) for k, v in expected.items()}, draft
        assert _kept(sched)[1] > 0


def test_abort_mid_draft(models):
    """A request aborted while it holds a draft: its KV (and the draft's scratch) goes nowhere it should not; the
    others finish as without speculation."""
    prompts = make_prompts(53, 3, lo=10, hi=20)
    reqs = [request(f"r{i}", p, max_new_tokens=16) for i, p in enumerate(prompts)]
    expected = serve(make(models, None), reqs)
    sched = make(models, "same")
    for r in reqs:
        sched.add_request(r)
    early: dict[str, list[int]] = {}
    for _ in range(3):
        for out in sched.step():
            early.setdefault(out.rid, []).extend(out.new_output_ids)
    victim = next(r for r in sched.running if r.rid == "r1")
    assert victim.kv.draft is not None
    sched.abort_request("r1")
    got = run_all(sched)
    assert got["r1"]["finish_reason"]["type"] == "abort"
    for rid in ("r0", "r2"):
        assert early.get(rid, []) + got[rid]["output_ids"] == expected[rid]["output_ids"]
    sched.check_memory()
    assert sched.is_idle()


def _collect(sched: Scheduler, reqs) -> dict:
    for r in reqs:
        sched.add_request(r)
    got: dict = {}
    while not sched.is_idle():
        for out in sched.step():
            g = got.setdefault(out.rid, {"ids": [], "lps": [], "top": []})
            g["ids"] += out.new_output_ids
            g["lps"] += [lp for lp, _ in out.output_token_logprobs]
            g["top"] += [[t for _, t in top] for top in out.output_top_logprobs]
    return got


def test_logprobs_of_kept_tokens_and_sampled_requests_beside_greedy_ones(models):
    """Kept draft tokens carry the logprobs and top candidates the target gives them without speculation; seeded
    sampled requests share the verification passes (their tokens follow speculative sampling, not the same draws,
    but their lengths and the KV accounting hold)."""
    prompts = make_prompts(54, 4, lo=10, hi=20)

    def reqs():
        made = [request(f"g{i}", p, max_new_tokens=12, return_logprob=True, top_logprobs_num=2)
                for i, p in enumerate(prompts)]
        for i, p in enumerate(prompts[:2]):
            r = request(f"s{i}", p, max_new_tokens=12)
            r.sampling_params.temperature, r.sampling_params.sampling_seed = 0.7, 10 + i
            made.append(r)
        return made

    expected = _collect(make(models, None), reqs())
    sched = make(models, "same")
    got = _collect(sched, reqs())
    for rid, e in expected.items():
        g = got[rid]
        assert len(g["ids"]) == 12, rid
        if rid.startswith("g"):
            assert g["ids"] == e["ids"] and g["top"] == e["top"], rid
            assert g["lps"] == pytest.approx(e["lps"], abs=1e-4), rid
    assert _kept(sched)[0] > 0
    sched.check_memory()
