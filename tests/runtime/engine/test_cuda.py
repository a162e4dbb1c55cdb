"""The runtime core on CUDA (run on the GPU machine; skipped without CUDA): a tiny random Llama with a
tokenizer trained in the test, greedy outputs token-exact against transformers on the same GPU in float32,
with retraction, chunked prefill, a shared-prefix decode batch and bfloat16."""
from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def tiny_cuda_model(tmp_path_factory) -> str:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tiny-cuda-llama")
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(2, 9))) for _ in range(3000)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(words[i : i + 12]) for i in range(0, 3000, 12)], vocab_size=VOCAB,
                            special_tokens=["<s>", "</s>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>")
    assert len(tok) == VOCAB
    tok.save_pretrained(d)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits than the default init, so greedy has no near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model.save_pretrained(d, safe_serialization=True)
    return str(d)


VOCAB = 400


def _prompts(n: int, seed: int = 0, shared: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    common = [rng.randrange(2, VOCAB) for _ in range(shared)]
    return [common + [rng.randrange(2, VOCAB) for _ in range(rng.randrange(5, 90))] for _ in range(n)]


def _hf_greedy(model_dir: str, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    from benchmarks.offline.gpu_correctness import hf_greedy

    return hf_greedy(model_dir, torch.float32, prompts, max_new, pad_token_id=1)


@pytest.mark.parametrize("kwargs, shared", [
    ({}, 0),
    ({"max_total_tokens": 400, "schedule_conservativeness": 0.05}, 0),
    ({"chunked_prefill_size": 16, "page_size": 4}, 0),
    ({}, 96),
    ({"disable_cuda_graph": True}, 300),  # groups over a 300-token prefix
    ({"mixed_chunk": "on", "chunked_prefill_size": 16, "page_size": 4}, 0),
], ids=["plain", "retraction", "chunked-pages", "shared-prefix", "shared-prefix-decode", "mixed-chunk"])
def test_cuda_greedy_matches_transformers(tiny_cuda_model, kwargs, shared):
    import radixlm

    prompts = _prompts(8, seed=len(kwargs) + shared, shared=shared)
    reference = _hf_greedy(tiny_cuda_model, prompts, 16)
    kwargs.setdefault("max_total_tokens", 8192)
    engine = radixlm.Engine(tiny_cuda_model, device="cuda", dtype="float32", enable_integrity_check=True, **kwargs)
    try:
        # min_new_tokens masks EOS as transformers' does (ignore_eos would leave it choosable).
        outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                                   "min_new_tokens": 16})
        assert [o["output_ids"] for o in outs] == reference
        if "schedule_conservativeness" in kwargs:
            assert engine.scheduler.stats["retractions"] > 0
        if kwargs.get("mixed_chunk") == "on":  # eager passes of chunks and decode rows, through the extend kernel
            assert engine.scheduler.stats["mixed_batches"] > 0
    finally:
        engine.shutdown()


def test_cuda_bfloat16_runs(tiny_cuda_model):
    import radixlm

    engine = radixlm.Engine(tiny_cuda_model, device="cuda", dtype="bfloat16", max_total_tokens=4096)
    try:
        outs = engine.generate(input_ids=_prompts(4), sampling_params={"max_new_tokens": 8, "temperature": 0.7, "sampling_seed": 1},
                               return_logprob=True)
        assert all(len(o["output_ids"]) == 8 for o in outs)
        assert all(lp <= 0 for o in outs for lp, _t, _x in o["meta_info"]["output_token_logprobs"])
    finally:
        engine.shutdown()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_and_overlap_match_eager_synchronous(tiny_cuda_model, dtype):
    """Graphs and overlap are the CUDA defaults; greedy outputs equal the eager, synchronous scheduler's, with
    requests of different lengths finishing at different steps, chunked prefill and retraction."""
    import radixlm

    prompts = _prompts(24, seed=7)
    params = [{"temperature": 0, "max_new_tokens": 6 + i % 11, "ignore_eos": True} for i in range(len(prompts))]
    runs = {}
    for name, kw in {"default": {}, "eager-sync": {"disable_cuda_graph": True, "overlap_schedule": "off"},
                     "graphs-sync": {"overlap_schedule": "off"}, "eager-overlap": {"disable_cuda_graph": True},
                     "pressure": {"max_total_tokens": 900, "schedule_conservativeness": 0.05, "chunked_prefill_size": 32,
                                  "cuda_graph_max_bs": 8}}.items():
        kw.setdefault("max_total_tokens", 8192)
        engine = radixlm.Engine(tiny_cuda_model, device="cuda", dtype=dtype, enable_integrity_check=True, **kw)
        try:
            runner = engine.scheduler.runner
            assert (runner.graph_runner is not None) == ("disable_cuda_graph" not in kw)
            assert engine.scheduler.overlap == (kw.get("overlap_schedule") != "off")
            runs[name] = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
            stats = engine.scheduler.stats
            if engine.scheduler.overlap:
                assert stats["overlapped_batches"] > 0
            if name == "pressure":
                assert stats["retractions"] > 0
        finally:
            engine.shutdown()
    for name, outs in runs.items():
        if dtype == "float32":
            assert outs == runs["eager-sync"], name
        else:
            # bf16 rounds differently in padded graph batches (other GEMM tilings, fixed split counts): near-ties
            # may flip late in a sequence, not more.
            same = sum(a == b for a, b in zip(outs, runs["eager-sync"]))
            assert same >= 0.75 * len(outs), (name, same)


def _compiled_variants() -> dict[str, int]:
    """How many variants of each of our Triton kernels are compiled (Triton's per-device kernel caches)."""
    from radixlm.runtime.kernels.elementwise import fused_kernels
    from radixlm.runtime.kernels.attention import extend as extend_attention

    kernels = {"extend": extend_attention._extend_kernel, "rotary": fused_kernels._rotary_kernel,
               "store_kv": fused_kernels._store_kv_kernel, "rmsnorm": fused_kernels._rmsnorm_kernel}
    return {name: sum(len(cache[0]) for cache in k.device_caches.values()) for name, k in kernels.items()}


def test_cuda_serving_compiles_no_kernel_after_start_up(tiny_cuda_model):
    """Start-up builds the kernels of eager passes; batches of any size and shape then reuse them, whatever the
    alignment of their index vectors (odd request and token counts put them at odd offsets)."""
    import radixlm

    engine = radixlm.Engine(tiny_cuda_model, device="cuda", dtype="bfloat16", max_total_tokens=8192,
                            cuda_graph_max_bs=8, overlap_schedule="off")
    try:
        before = _compiled_variants()
        for n in (1, 2, 3, 5, 8):  # prefills of more tokens than the largest graph run eagerly
            prompts = _prompts(n, seed=n)
            engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 3})
        assert _compiled_variants() == before
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def tiny_cuda_moe_model(tiny_cuda_model, tmp_path_factory) -> str:
    """A tiny random Mixtral (4 experts, top-2) with the dense model's tokenizer."""
    import shutil
    from pathlib import Path

    from transformers import MixtralConfig, MixtralForCausalLM

    d = tmp_path_factory.mktemp("tiny-cuda-mixtral")
    for f in Path(tiny_cuda_model).iterdir():
        weights = f.name.endswith(".safetensors")
        if f.is_file() and not weights and f.name not in ("config.json", "generation_config.json"):
            shutil.copyfile(f, d / f.name)
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=8, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    MixtralForCausalLM(config).save_pretrained(d, safe_serialization=True)
    return str(d)


@pytest.mark.parametrize("which, configs", [
    ("dense", ["default", "page16", "chunked", "fcfs_nomixed", "small_graphs", "nograph", "sync"]),
    ("moe", ["default", "page16", "nograph", "fp8"]),
])
def test_cuda_no_triton_compile_after_start_up(tiny_cuda_model, tiny_cuda_moe_model, tmp_path, which, configs):
    """Issue 20: each engine configuration in a fresh process (nothing compiled in memory), bf16 (the skinny GEMMs
    too), a varied workload after start-up -- shared prefixes, batches of 1..33 requests with random prompt and
    output lengths, 1-token and longer-than-a-chunk prompts, prefix hits extended by 1..40 tokens, prompt logprobs,
    page sizes 1, 4 and 16, chunked prefill, graphs off or capped at 8 rows -- and Triton's JIT cache-miss hook
    counts no kernel built after start-up (benchmarks/startup/compile_count_gpu.py; it names any that is)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    model = tiny_cuda_model if which == "dense" else tiny_cuda_moe_model
    out = tmp_path / "compile_count.json"
    proc = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "startup" / "compile_count_gpu.py"), "--model", model,
         "--dtype", "bfloat16", "--scale", "tiny", "--shared-cache", "--engine-args",
         json.dumps({"max_total_tokens": 30000, "cuda_graph_max_bs": 64}),  # fewer graphs to capture: a faster test
         "--out", str(out), "--configs", *configs],
        cwd=repo, capture_output=True, text=True, timeout=1800)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == configs
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["compiles_at_startup"] > 0, r  # a fresh process builds (or loads) its kernels: the hook counts
        assert r["compiles_after_startup"] == 0, (r["config"], r["compiled_after_startup"])
        assert r["cache_dir_kernels_after_startup"] == 0, r["config"]


def _eagle_head(model_dir: str, out_dir) -> str:
    """A random EAGLE-1 head (published checkpoint layout) for the tiny model: one decoder layer over [embedding,
    feature]."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    config = json.loads((Path(model_dir) / "config.json").read_text())
    h, inter = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    g = torch.Generator().manual_seed(5)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    weights = {"fc.weight": r(h, 2 * h), "fc.bias": r(h), "layers.0.post_attention_layernorm.weight": 1 + r(h),
               **{f"layers.0.self_attn.{k}.weight": v for k, v in
                  {"q_proj": r(h, h), "k_proj": r(kv, h), "v_proj": r(kv, h), "o_proj": r(h, h)}.items()},
               **{f"layers.0.mlp.{k}.weight": v for k, v in
                  {"gate_proj": r(inter, h), "up_proj": r(inter, h), "down_proj": r(h, inter)}.items()}}
    out = Path(out_dir)
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    return str(out)


@pytest.mark.parametrize("page_size", [1, 4])
def test_cuda_eagle_tree_drafts_on_triton(tiny_cuda_model, tmp_path, page_size):
    """EAGLE tree drafts (--speculative-eagle-topk 3) on the Triton backend (its extend kernel's tree masks, in the
    target's verification passes and the head's tree steps; graphs and overlap on): trees drafted, not chains, greedy
    outputs equal speculation off, and no extend-kernel variant built after start-up (the masked ones included)."""
    import radixlm

    head = _eagle_head(tiny_cuda_model, tmp_path)
    prompts = _prompts(6, seed=11)
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    runs = {}
    for name, kw in {"off": {}, "tree": dict(speculative_algorithm="EAGLE", speculative_draft_model_path=head,
                                             speculative_num_draft_tokens=8, speculative_num_steps=3,
                                             speculative_eagle_topk=3)}.items():
        engine = radixlm.Engine(tiny_cuda_model, device="cuda", dtype="float32", max_total_tokens=8192,
                                page_size=page_size, enable_integrity_check=True, **kw)
        try:
            before = _compiled_variants()
            runs[name] = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
            if name == "tree":
                stats = engine.scheduler.grammar_stats
                assert stats["tree_drafts"] > 0 and not stats.get("tree_drafts_unsupported"), dict(stats)
                assert _compiled_variants()["extend"] == before["extend"]
        finally:
            engine.shutdown()
    assert runs["tree"] == runs["off"]


def test_cuda_tuned_gemms_change_no_token(tiny_cuda_model, monkeypatch):
    """A tuned cuBLASLt table (here for the tiny model's shapes at the 48-row graph: configurations from the
    heuristic's list that reproduce torch's GEMM) is installed at start-up, runs in the decode graphs, and changes no
    token against torch's GEMMs."""
    import torch.nn.functional as F

    import radixlm
    from radixlm.runtime.kernels.gemm import cublaslt

    lt, m, table = cublaslt.CublasLt(), 48, []
    for n, k in [(192, 128), (128, 128), (512, 128), (128, 256), (VOCAB, 128)]:  # qkv, o, gate_up, down, lm_head
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        gemm = cublaslt.LtGemm(lt, m, n, k, torch.bfloat16)
        for found in gemm.heuristic():
            gemm.candidates = [found]
            if torch.equal(gemm(x, w), F.linear(x, w)):
                table.append({"n": n, "k": k, "m": m, "dtype": "bfloat16", "us": 1.0, "cublas_us": 1.0,
                              "config": cublaslt.algo_config(lt, found.algo)})
                break
    assert table
    monkeypatch.setattr(cublaslt, "load_table",
                        lambda device_name, kind="cublaslt": table if kind == "cublaslt" else [])
    prompts = _prompts(m, seed=3)
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    runs = {}
    for disable in (False, True):
        engine = radixlm.Engine(tiny_cuda_model, device="cuda", dtype="bfloat16", max_total_tokens=8192,
                                disable_tuned_gemm=disable)
        try:
            counts = engine.scheduler.runner.gemm_choice_counts()
            tuned = sum(by_kernel.get("cublaslt", 0) for keys in counts.values() for by_kernel in keys.values())
            assert (tuned > 0) != disable, counts
            runs[disable] = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
        finally:
            engine.shutdown()
    assert runs[False] == runs[True]
