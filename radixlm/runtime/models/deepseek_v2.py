"""DeepSeek-V2 (V2, V2-Lite) and DeepSeek-V3 (V3, R1, and the models that copy its layout: Kimi-K2): multi-head latent
attention (layers.mla) over a latent KV pool, and DeepSeek's MoE.

MoE: layer i is sparse when i >= first_k_dense_replace and i % moe_layer_freq == 0 (else a dense MLP of
intermediate_size). A sparse block routes each token to num_experts_per_tok of n_routed_experts experts (of
moe_intermediate_size) by its router `gate` (float32, as transformers keeps it), and adds n_shared_experts shared
experts (one dense MLP of n_shared_experts * moe_intermediate_size). The routing (kernels.moe.Routing):
  V2: softmax scores; topk_method greedy, or group_limited_greedy (n_group groups scored by their best expert, the
      topk_group best kept);
  V3: sigmoid scores plus e_score_correction_bias for the choice (noaux_tc), groups scored by their best two experts;
both: weights renormalised when norm_topk_prob, then times routed_scaling_factor (transformers' V2 never renormalises;
DeepSeek-V2 checkpoints all set norm_topk_prob false). A config's scoring_func / topk_method override the defaults.

Checkpoints: transformers' names, experts one tensor per expert and projection; kv_b_proj is split into W_UK / W_UV
at load (layers.mla.LatentUpProjection); V3's multi-token-prediction layer (model.layers.{num_hidden_layers}...)
is skipped: it is a draft model (models/deepseek_mtp.py, loaded by --speculative-algorithm EAGLE), not part of this
one."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.kernels.gemm import Prologue, apply_prologue
from radixlm.runtime.kernels.moe import ExpertGroups, GroupScore, Routing, ScoringFunc
from radixlm.runtime.layers.attention.mla import latent_attention_supports_cuda_graph
from radixlm.runtime.layers.linear import VocabEmbedding
from radixlm.runtime.layers.mla import MultiHeadLatentAttention, mla_softmax_scale
from radixlm.runtime.layers.moe import FusedMoE, expert_weight_name
from radixlm.runtime.layers.norm import RMSNorm
from radixlm.runtime.layers.rotary import get_rope, rope_params_from_config
from radixlm.runtime.models.llama import (LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel, LoadReport,
                                          chain_reduces, init_reduces)
from radixlm.runtime.models.qwen_moe import SharedExpertMLP

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Checkpoint: model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(\w+)$")
_PARTS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")
# Checkpoint name fragment -> (our fused parameter fragment, shard index); the first two only with a q LoRA.
_Q_LORA_STACKED = [(".q_a_proj.", ".fused_qkv_a_proj_with_mqa.", 0),
                   (".kv_a_proj_with_mqa.", ".fused_qkv_a_proj_with_mqa.", 1)]
_MLP_STACKED = [(".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1)]
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def routing_of(config: "PretrainedConfig", scoring: str, topk_method: str) -> tuple[Routing, bool]:
    """(the routing rule, whether the router has an e_score_correction_bias) of a DeepSeek config; scoring and
    topk_method are the architecture's defaults, which the config's scoring_func / topk_method override."""
    method = getattr(config, "topk_method", None) or topk_method
    if method not in TOPK_METHODS:
        raise ValueError(f"unsupported topk_method {method!r}; supported: {', '.join(TOPK_METHODS)}")
    scoring_func = getattr(config, "scoring_func", None) or scoring
    try:
        scoring_enum = ScoringFunc(scoring_func)
    except ValueError:
        raise ValueError(f"unsupported scoring_func {scoring_func!r}; supported: softmax, sigmoid") from None
    groups = None
    if method == "group_limited_greedy":
        if not (getattr(config, "n_group", None) and getattr(config, "topk_group", None)):
            raise ValueError("topk_method group_limited_greedy needs n_group and topk_group")
        groups = ExpertGroups(int(config.n_group), int(config.topk_group), GroupScore.MAX)
    elif method == "noaux_tc":
        groups = ExpertGroups(int(config.n_group or 1), int(config.topk_group or 1), GroupScore.TOP2_SUM)
    routing = Routing(int(config.num_experts_per_tok), bool(getattr(config, "norm_topk_prob", False)),
                      scoring_enum, groups, float(getattr(config, "routed_scaling_factor", 1.0) or 1.0))
    routing.check(int(config.n_routed_experts))
    return routing, method == "noaux_tc"


def is_moe_layer(config: "PretrainedConfig", layer_id: int) -> bool:
    freq = getattr(config, "moe_layer_freq", 1) or 1
    return (bool(getattr(config, "n_routed_experts", None)) and layer_id >= (config.first_k_dense_replace or 0)
            and layer_id % freq == 0)


class MoEGate(nn.Module):
    """The router: float32 logits over the routed experts (and V3's e_score_correction_bias), replicated."""

    def __init__(self, hidden_size: int, num_experts: int, correction_bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=torch.float32), requires_grad=False)
        self.e_score_correction_bias = (nn.Parameter(torch.empty(num_experts, dtype=torch.float32),
                                                     requires_grad=False) if correction_bias else None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.float(), self.weight)


class DeepseekV2MoE(nn.Module):
    can_defer_reduce = True  # LlamaDecoderLayer may leave the sum over ranks to the next norm

    def __init__(self, config: "PretrainedConfig", routing: Routing, correction_bias: bool, parallel: Parallel):
        super().__init__()
        self.parallel = parallel
        shared = (getattr(config, "n_shared_experts", 0) or 0) * config.moe_intermediate_size
        self.gate = MoEGate(config.hidden_size, config.n_routed_experts, correction_bias)
        # The routed and shared partial sums share one all-reduce (here, or the next norm's).
        self.experts = FusedMoE(config.n_routed_experts, routing.top_k, config.hidden_size,
                                config.moe_intermediate_size, routing.renormalize, parallel,
                                reduce_results=False, routing=routing)
        self.shared_experts = SharedExpertMLP(config.hidden_size, shared, parallel) if shared else None

    def forward(self, hidden: torch.Tensor, prologue: Prologue | None = None, reduce: bool = True) -> torch.Tensor:
        """reduce=False: this rank's partial sum (tensor parallel), left to the next norm."""
        hidden = apply_prologue(prologue, hidden)
        out = self.experts(hidden, self.gate(hidden), self.gate.e_score_correction_bias)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden)
        return self.parallel.all_reduce(out) if reduce else out


class DeepseekV2DecoderLayer(nn.Module):
    forward = LlamaDecoderLayer.forward  # the same residual and fused-norm flow, around MLA

    def __init__(self, config: "PretrainedConfig", layer_id: int, attn: MultiHeadLatentAttention, mlp: nn.Module,
                 parallel: Parallel):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        init_reduces(self, parallel)


class DeepseekV2Model(nn.Module):
    forward = LlamaModel.forward

    def __init__(self, config: "PretrainedConfig", layers: list[DeepseekV2DecoderLayer], parallel: Parallel):
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, parallel)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm_reduce = chain_reduces(self.layers)


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    default_scoring = "softmax"
    default_topk_method = "greedy"

    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        nn.Module.__init__(self)
        self.config = config
        self.parallel = parallel
        build = self.layer_builder(config)
        self.model = DeepseekV2Model(config, [build(i, i, parallel) for i in range(config.num_hidden_layers)], parallel)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = (self.model.embed_tokens if self.tie_word_embeddings
                        else VocabEmbedding(config.vocab_size, config.hidden_size, parallel))
        self._stacked = (_Q_LORA_STACKED if getattr(config, "q_lora_rank", None) is not None else []) + _MLP_STACKED

    @classmethod
    def layer_builder(cls, config: "PretrainedConfig") -> Callable[[int, int, Parallel], DeepseekV2DecoderLayer]:
        """build(layer_id, kv_layer_id, parallel): the checkpoint's layer `layer_id` (dense or MoE by its index),
        its latent cache at pool layer `kv_layer_id` (an MTP layer has a pool of its own); one rope for all."""
        theta, scaling = rope_params_from_config(config)
        # One cos/sin cache for all layers: the rope dims only, in DeepSeek's interleaved pairs.
        rope = get_rope(config.qk_rope_head_dim, config.max_position_embeddings, theta, scaling,
                        interleaved=bool(getattr(config, "rope_interleave", True)))
        scale = mla_softmax_scale(config, scaling)
        routing, correction_bias = (routing_of(config, cls.default_scoring, cls.default_topk_method)
                                    if getattr(config, "n_routed_experts", None) else (None, False))

        def build(layer_id: int, kv_layer_id: int, parallel: Parallel) -> DeepseekV2DecoderLayer:
            mlp = (DeepseekV2MoE(config, routing, correction_bias, parallel) if is_moe_layer(config, layer_id)
                   else LlamaMLP(config.hidden_size, config.intermediate_size, parallel=parallel))
            attn = MultiHeadLatentAttention(config, kv_layer_id, rope, scale, parallel)
            return DeepseekV2DecoderLayer(config, layer_id, attn, mlp, parallel)

        return build

    supports_shared_prefix = False  # latent attention reads every row's prefix itself (no shared-prefix decode)

    @property
    def supports_cuda_graph(self) -> bool:
        return latent_attention_supports_cuda_graph(self.config.kv_lora_rank, self.config.qk_rope_head_dim)

    def map_weight_name(self, name: str) -> tuple[str, object]:
        expert = expert_weight_name(name, _EXPERT, _PARTS)
        if expert is not None:
            return expert
        for ckpt_frag, our_frag, shard_id in self._stacked:
            if ckpt_frag in name:
                return name.replace(ckpt_frag, our_frag), shard_id
        return name, None

    def _checkpoint_name(self, target: str, shard) -> str:
        for ckpt_frag, our_frag, shard_id in self._stacked:
            if our_frag in target and shard == shard_id:
                return target.replace(our_frag, ckpt_frag)
        return target if shard is None else f"{target}[shard {shard}]"

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], require_all: bool = True) -> LoadReport:
        return super().load_weights(((n, w) for n, w in weights if not self._is_mtp(n)), require_all)

    def _is_mtp(self, name: str) -> bool:
        m = _LAYER.match(name)
        return m is not None and int(m.group(1)) >= self.config.num_hidden_layers


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    default_scoring = "sigmoid"
    default_topk_method = "noaux_tc"
