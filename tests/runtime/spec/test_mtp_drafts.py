"""DeepSeek-V3's MTP layer as the EAGLE draft (--speculative-algorithm EAGLE, no draft path: the target's own layer),
through the offline Engine on a tiny random V3 (float32, CPU) written with transformers plus the MTP tensors
(model.layers.{num_hidden_layers}.*: transformers' DeepseekV3 has none) written into its safetensors here.

The MTP layer is made a good predictor of the target: the target has one (MoE) layer and unit-RMS embedding rows, and
the MTP layer is that layer's copy, eh_proj = [I | small random] (the feature half small but not zero), enorm and
hnorm ones, shared_head.norm the final norm -- so it computes nearly the target's next step and drafts are accepted.
Every draft equals a reference chain computed with transformers' own DeepseekV3 decoder layer over the MTP weights,
and greedy outputs equal those without drafts, with chunked prefill, retraction and radix-cache hits."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

import radixlm
from radixlm.runtime.args import ServerArgs
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.spec.budget import DraftBudget, draft_budget
from radixlm.runtime.spec.mtp import uses_mtp
from radixlm.runtime.spec.sources.model import EagleSource
from tests.runtime.models.test_deepseek import COMMON, TIGHT, prompts_without_pad, save_deepseek

CONFIG = dict(COMMON, num_hidden_layers=1, first_k_dense_replace=0, q_lora_rank=24, n_routed_experts=8,
              num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2, norm_topk_prob=True,
              routed_scaling_factor=2.5, num_nextn_predict_layers=1)
GREEDY = {"temperature": 0, "max_new_tokens": 12}
FEATURE_SCALE = 0.05  # eh_proj's feature half: small enough to keep the copy a good predictor, not zero


def _mtp_tensors(hf, weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """model.layers.1.*: the checkpoint's layer 0 copied, the head's own tensors, and the shared copies real
    checkpoints carry."""
    g = torch.Generator().manual_seed(seed)
    h, n = hf.config.hidden_size, hf.config.num_hidden_layers
    own = {k[len("model.layers.0."):]: v.clone() for k, v in weights.items() if k.startswith("model.layers.0.")}
    own.update({
        "enorm.weight": torch.ones(h), "hnorm.weight": torch.ones(h),
        "eh_proj.weight": torch.cat([torch.eye(h), torch.randn(h, h, generator=g) * FEATURE_SCALE], dim=1),
        "shared_head.norm.weight": weights["model.norm.weight"].clone(),
        "shared_head.head.weight": weights["lm_head.weight"].clone(),
        "embed_tokens.weight": weights["model.embed_tokens.weight"].clone(),
    })
    return {f"model.layers.{n}.{k}": v.contiguous() for k, v in own.items()}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("deepseek_v3_mtp")
    hf = save_deepseek(DeepseekV3Config(**CONFIG), path, seed=11)
    with torch.no_grad():
        e = hf.model.embed_tokens.weight
        e.copy_(e / e.pow(2).mean(-1, keepdim=True).sqrt())  # unit RMS: enorm(embedding) is the embedding
    hf.save_pretrained(path, safe_serialization=True)
    weights = load_file(str(path / "model.safetensors"))
    mtp = _mtp_tensors(hf, weights, seed=12)
    save_file({**weights, **mtp}, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path, hf, _reference_head(hf, mtp)


def _reference_head(hf, mtp: dict[str, torch.Tensor]):
    """transformers' one-layer DeepseekV3 holding the MTP layer (a copy of the target's layer; its final norm:
    shared_head.norm), and the head's own tensors."""
    n = hf.config.num_hidden_layers
    ref = DeepseekV3ForCausalLM(DeepseekV3Config(**{**CONFIG, "num_hidden_layers": 1}))
    ref.model.layers[0].load_state_dict(hf.model.layers[0].state_dict())
    own = {k.split(".", 3)[3]: v for k, v in mtp.items() if k.startswith(f"model.layers.{n}.")}
    ref.model.norm.weight.data.copy_(own["shared_head.norm.weight"])
    return ref.eval(), own


def reference_chain(hf, head, tokens: list[int], k: int) -> list[int]:
    """The k tokens the MTP layer drafts after `tokens`: pairs (h_i, t_{i+1}) of the target's final hidden states,
    then each output paired with the token it gave."""
    ref, w = head
    rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + CONFIG["rms_norm_eps"]) * g  # noqa: E731
    with torch.no_grad():
        features = hf.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
        embed, lm_head, pairs, draft = hf.model.embed_tokens.weight, hf.lm_head.weight, list(tokens[1:]), []
        for _ in range(k):
            x = torch.cat([rms(embed[pairs], w["enorm.weight"]), rms(features, w["hnorm.weight"])], -1)
            out = ref.model(inputs_embeds=(x @ w["eh_proj.weight"].T)[None]).last_hidden_state[0, -1]
            draft.append(int(torch.argmax(out @ lm_head.T)))
            features, pairs = torch.cat([features, out[None]]), pairs + [draft[-1]]
    return draft


def _run(path, graphs: bool = False, **kw):
    engine = radixlm.Engine(str(path), dtype="float32", device="cpu", random_seed=0, enable_integrity_check=True,
                            **TIGHT, **kw)
    seen = []
    try:
        sources = [s for s in engine.scheduler.drafts.sources if isinstance(s, EagleSource)]
        if graphs:  # the graph runners' eager stand-ins: padded target passes, chain steps from the feature buffer
            engine.runner.graph_runner = CudaGraphRunner(engine.runner, 32, use_graphs=False)
            head = sources[0].runner
            head.capture_chain_graphs(32, use_graphs=False)
            replay = head.chain_graphs.replay
            head.chain_graphs.replay = lambda fb: (engine.scheduler.stats.update(["chain_replays"]), replay(fb))[1]
        for source in sources:
            propose = source.propose_batch

            def recording(reqs, limits, propose=propose):
                propose(reqs, limits)
                seen.extend((r.origin_input_ids + r.output_ids, list(r.kv.draft.tokens)) for r in reqs
                            if r.kv.draft is not None)

            source.propose_batch = recording
        prompts = prompts_without_pad(7)
        first = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        again = engine.generate(input_ids=prompts[:3], sampling_params=GREEDY)  # radix-cache hits
        info = (engine.scheduler.stats, sources and sources[0].runner)
    finally:
        engine.shutdown()
    return first + again, seen, info


@pytest.fixture(scope="module")
def plain(target):
    return [r["output_ids"] for r in _run(target[0])[0]]


@pytest.mark.parametrize("kw, graphs", [
    pytest.param({"speculative_num_steps": 2}, False, id="chain"),
    pytest.param({"speculative_num_steps": 3}, True, id="chain-graph-rows"),
    pytest.param({"speculative_num_steps": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4}, False,
                 id="tree"),
])
def test_mtp_drafts_keep_greedy_outputs_and_are_accepted(target, plain, kw, graphs):
    path, hf, head = target
    # The controller (drafting on or off by measured speed) would make the runs depend on the clock.
    got, seen, (stats, runner) = _run(path, graphs, speculative_algorithm="EAGLE", speculative_measure_window=0, **kw)
    assert [r["output_ids"] for r in got] == plain
    meta = [r["meta_info"] for r in got]
    drafted, accepted = (sum(m.get(k, 0) for m in meta) for k in ("spec_draft_tokens", "spec_accepted_tokens"))
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    assert len(seen) >= 5
    if "speculative_eagle_topk" not in kw:
        for tokens, draft in seen:
            assert draft == reference_chain(hf, head, tokens, len(draft)), tokens
    else:
        assert runner.target.attn_backend.supports_tree_mask and any(len(d) > 2 for _, d in seen)
    assert stats["retractions"] > 0 and sum(r["meta_info"]["cached_tokens"] for r in got[-3:]) > 0
    assert (stats["chain_replays"] > 0) == graphs
    # The head's KV: one latent row (kv_lora_rank + qk_rope_head_dim) per token, float32; the budget counts it.
    assert runner.kv_bytes_per_token() == (CONFIG["kv_lora_rank"] + CONFIG["qk_rope_head_dim"]) * 4
    budget = draft_budget(runner.server_args, runner.target.model_config)
    assert budget == DraftBudget(sum(p.numel() * p.element_size() for p in runner.model.parameters()),
                                 runner.kv_bytes_per_token())


def test_eagle_without_a_head_drafts_with_the_targets_mtp_layer(target):
    """SGLang's rule: --speculative-algorithm EAGLE on a checkpoint with MTP layers and no draft path (or the target's
    own) drafts with them; without MTP layers it needs a head, said at load."""
    path = str(target[0])
    cfg = ModelConfig.from_path(path, dtype="float32")
    assert uses_mtp(ServerArgs(model_path=path, speculative_algorithm="EAGLE"), cfg)
    assert uses_mtp(ServerArgs(model_path=path, speculative_algorithm="EAGLE", speculative_draft_model_path=path), cfg)
    assert not uses_mtp(ServerArgs(model_path=path, speculative_algorithm="NGRAM"), cfg)
    cfg.hf_config.num_nextn_predict_layers = 0
    with pytest.raises(ValueError, match="needs --speculative-draft-model-path"):
        uses_mtp(ServerArgs(model_path=path, speculative_algorithm="EAGLE"), cfg)


def test_fp8_block_checkpoint_drafts_with_its_fp8_mtp_layer(target, tmp_path):
    """The checkpoint as DeepSeek ships V3: every projection in FP8 blocks, the MTP layer's too (its kv_b_proj
    dequantized at load, as the target's), eh_proj in bf16. Drafting keeps the greedy outputs of the same FP8 model
    without drafts, and drafts are accepted."""
    import shutil

    from radixlm.runtime.kernels.quant import FP8_DTYPE
    from tests.runtime.quantization.helpers import DEEPSEEK_PROJ, quantize_saved
    from tests.runtime.quantization.test_deepseek_quantized import FP8_BLOCKS

    path = tmp_path / "fp8"
    shutil.copytree(target[0], path)
    quantize_saved(path, *FP8_BLOCKS, names=DEEPSEEK_PROJ)
    assert load_file(str(path / "model.safetensors"))["model.layers.1.self_attn.kv_b_proj.weight"].dtype == FP8_DTYPE
    plain_fp8 = [r["output_ids"] for r in _run(path)[0]]
    got, seen, (_stats, runner) = _run(path, speculative_algorithm="EAGLE", speculative_measure_window=0,
                                       speculative_num_steps=2)
    assert [r["output_ids"] for r in got] == plain_fp8
    assert sum(r["meta_info"].get("spec_accepted_tokens", 0) for r in got) > 0 and len(seen) >= 5
    attn = runner.model.decoder.self_attn
    assert attn.o_proj.weight.dtype == FP8_DTYPE and attn.kv_b_proj.quant_method is None
