"""Llama-family decoder (Llama 2/3/3.1, SmolLM2) and the shared pieces Mistral, Qwen2 and Qwen3 reuse.

The per-architecture differences are class-level flags on the CausalLM: QKV bias, o_proj bias, per-head
q/k RMSNorm. Parameters are fused (qkv_proj, gate_up_proj) and loaded by stacking HF's separate ones."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.kernels.gemm import Prologue
from radixlm.runtime.layers.activation import SiluAndMul
from radixlm.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Shard, VocabEmbedding, copy_checked
from radixlm.runtime.layers.norm import RMSNorm
from radixlm.runtime.layers.radix_attention import RadixAttention
from radixlm.runtime.layers.rotary import get_rope, rope_params_from_config
from radixlm.runtime.models.kv_scales import load_kv_scale

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


def head_dim_of(config: "PretrainedConfig") -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, parallel: Parallel = SINGLE):
        super().__init__()
        part = Shard.split(intermediate_size, parallel, "intermediate_size")
        self.gate_up_proj = ColumnParallelLinear(hidden_size, [part, part], bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, parallel=parallel)
        self.act_fn = SiluAndMul()
        self.can_defer_reduce = not bias  # a bias is added after the sum over ranks

    def forward(self, x: torch.Tensor, prologue: Prologue | None = None, reduce: bool = True) -> torch.Tensor:
        """prologue: x before its norm (the GEMMs fuse the norm, and the activation, where they can). reduce=False:
        down_proj's partial sum (tensor parallel), left to the next norm."""
        return self.down_proj(self.gate_up_proj(x, prologue), self.act_fn.prologue(), reduce)


class LlamaAttention(nn.Module):
    def __init__(
        self, config: "PretrainedConfig", layer_id: int, rotary_emb: nn.Module, qkv_bias: bool, o_bias: bool,
        qk_norm: bool, parallel: Parallel,
    ):
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = head_dim_of(config)
        q = Shard.heads(total_heads, self.head_dim, parallel, "num_attention_heads")
        kv = Shard.heads(total_kv_heads, self.head_dim, parallel, "num_key_value_heads")
        self.num_heads, self.num_kv_heads = q.local // self.head_dim, kv.local // self.head_dim
        self.q_size, self.kv_size = q.local, kv.local
        self.qkv_proj = ColumnParallelLinear(config.hidden_size, [q, kv, kv], bias=qkv_bias)
        self.o_proj = RowParallelLinear(q.full, config.hidden_size, bias=o_bias, parallel=parallel)
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.rotary_emb = rotary_emb
        self.takes_rotary_epilogue = not qk_norm  # read by the model runner's start-up builds too
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: "ForwardBatch",
                prologue: Prologue | None = None, reduce: bool = True) -> torch.Tensor:
        """prologue: hidden before its norm; reduce: as LlamaMLP.forward's, for o_proj."""
        rotary = (self.rotary_emb, positions)
        # Without q/k norms the qkv GEMM may rotate q and k and store the KV itself.
        epilogue = self.attn.qkv_epilogue(forward_batch, rotary) if self.takes_rotary_epilogue else None
        q, k, v = self.qkv_proj(hidden, prologue, epilogue).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        # The CUDA KV store reads strided rows; the CPU path wants v contiguous.
        o = self.attn(q, k, v if v.is_cuda else v.contiguous(), forward_batch, rotary, epilogue)
        return self.o_proj(o, reduce=reduce)


def init_reduces(layer: nn.Module, parallel: Parallel) -> None:
    """Decides once where a decoder layer's row-parallel sums over ranks go (tensor parallel): o_proj's into
    post_attention_layernorm (attn_reduce), the MLP's into the next norm (output_reduce: the next layer's
    input_layernorm, or the model's final norm), each done with the residual add and the norm in one kernel where the
    rank's comm has one (Parallel.fused_add_rmsnorm). input_reduce: the previous layer's output_reduce (chain_reduces);
    None for a first layer (the embedding's output is summed). Where a bias follows the sum it is not deferred."""
    tp = parallel.tp_size > 1
    layer.attn_reduce = parallel if tp and layer.self_attn.o_proj.bias is None else None
    layer.output_reduce = parallel if tp and getattr(layer.mlp, "can_defer_reduce", False) else None
    layer.input_reduce = None


def chain_reduces(layers: Iterable[nn.Module]) -> Parallel | None:
    """Hands each layer's partial output to the next one's input norm; returns the final norm's reduce."""
    pending = None
    for layer in layers:
        layer.input_reduce = pending
        pending = layer.output_reduce
    return pending


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: "PretrainedConfig", layer_id: int, rotary_emb: nn.Module, qkv_bias: bool, o_bias: bool,
        qk_norm: bool, mlp: nn.Module, parallel: Parallel,
    ):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, rotary_emb, qkv_bias, o_bias, qk_norm, parallel)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        init_reduces(self, parallel)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        forward_batch: "ForwardBatch",
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Invariant: on return, the layer's output is hidden + residual, where hidden, if partial (output_reduce
        # set), is summed over ranks first; likewise its input (input_reduce). The sum and the add are left to the
        # next norm, which is handed to the GEMM after it: it fuses the norm where it can and sets the new residual.
        pro = self.input_layernorm.prologue(residual, self.input_reduce)
        attn = self.self_attn(positions, hidden, forward_batch, pro, self.attn_reduce is None)
        residual = hidden if residual is None else pro.residual_out
        pro = self.post_attention_layernorm.prologue(residual, self.attn_reduce)
        return self.mlp(attn, pro, self.output_reduce is None), pro.residual_out


class LlamaModel(nn.Module):
    def __init__(self, config: "PretrainedConfig", qkv_bias: bool, o_bias: bool, qk_norm: bool, build_mlp,
                 parallel: Parallel, rotary_emb: nn.Module | None = None):
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, parallel)
        if rotary_emb is None:
            theta, scaling = rope_params_from_config(config)
            # One cos/sin cache for all layers (it holds no parameters).
            rotary_emb = get_rope(head_dim_of(config), config.max_position_embeddings, theta, scaling)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, rotary_emb, qkv_bias, o_bias, qk_norm, build_mlp(config, i, parallel), parallel)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm_reduce = chain_reduces(self.layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch") -> torch.Tensor:
        # A pass with media rows comes with its input embeddings (the executor's MultimodalEmbedder).
        hidden = self.embed_tokens(input_ids) if forward_batch.input_embeds is None else forward_batch.input_embeds
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, forward_batch, residual)
        if residual is None:  # zero layers
            return self.norm(hidden)
        if self.norm_reduce is not None:  # the last layer's output is partial
            return self.norm.prologue(residual, self.norm_reduce).apply(hidden)
        hidden, _ = self.norm(hidden, residual)
        return hidden


@dataclass
class LoadReport:
    """What a load_weights call took: (our parameter's name, shard id) of each tensor loaded, and the checkpoint names
    it ignored as the model's own parameters do not have them."""

    loaded: set[tuple[str, object]] = field(default_factory=set)
    unexpected: list[str] = field(default_factory=list)


# HF checkpoint name fragment -> (our fused parameter fragment, shard index)
STACKED_PARAMS: list[tuple[str, str, int]] = [
    (".q_proj.", ".qkv_proj.", 0),
    (".k_proj.", ".qkv_proj.", 1),
    (".v_proj.", ".qkv_proj.", 2),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
]
# Buffers some checkpoints carry that we recompute.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


class LlamaForCausalLM(nn.Module):
    qkv_bias_default = False  # Llama: `attention_bias` covers q, k, v and o
    o_bias_follows_attention_bias = True
    qk_norm = False

    def __init__(self, config: "PretrainedConfig", parallel: Parallel = SINGLE):
        super().__init__()
        self.config = config
        self.parallel = parallel
        attention_bias = bool(getattr(config, "attention_bias", self.qkv_bias_default))
        qkv_bias = self.qkv_bias_default or attention_bias
        o_bias = attention_bias and self.o_bias_follows_attention_bias
        self.model = LlamaModel(config, qkv_bias, o_bias, self.qk_norm, self.build_mlp, parallel, self.build_rope(config))
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens  # same Parameter: one copy, loaded once
        else:
            self.lm_head = VocabEmbedding(config.vocab_size, config.hidden_size, parallel)

    def drop_lm_head(self) -> None:
        """Served for pooled outputs (--is-embedding): no head is loaded (embedding checkpoints often have none)."""
        self.lm_head = self.model.embed_tokens
        self.tie_word_embeddings = True

    @staticmethod
    def build_rope(config: "PretrainedConfig") -> nn.Module | None:
        """The rotary embedding (None: the config's standard one; Qwen2-VL overrides this)."""
        return None

    @staticmethod
    def build_mlp(config: "PretrainedConfig", layer_id: int, parallel: Parallel) -> nn.Module:
        """The feed-forward block of layer `layer_id` (MoE models override this)."""
        return LlamaMLP(config.hidden_size, config.intermediate_size, getattr(config, "mlp_bias", False), parallel)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: "ForwardBatch") -> torch.Tensor:
        """Returns the final-normed hidden states (T, hidden_size); the caller applies lm_head."""
        return self.model(input_ids, positions, forward_batch)

    def map_weight_name(self, name: str) -> tuple[str, object]:
        """A checkpoint tensor's name -> (our parameter's name, shard id for its module's load_weight)."""
        for hf_frag, our_frag, shard_id in STACKED_PARAMS:
            if hf_frag in name:
                return name.replace(hf_frag, our_frag), shard_id
        return name, None

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], require_all: bool = True) -> LoadReport:
        """require_all: every parameter must be loaded (a checkpoint); False: any subset (a weight update)."""
        params = dict(self.named_parameters())
        loaded: set[tuple[str, object]] = set()
        unexpected: list[str] = []
        for name, w in weights:
            if name.endswith(IGNORED_SUFFIXES):
                continue
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue  # some tied checkpoints store the head too; it equals the embedding
            if load_kv_scale(self, name, w):
                continue
            target, shard_id = self.map_weight_name(name)
            if target not in params and f"model.{target}" in params:
                target = f"model.{target}"  # a backbone saved on its own (AutoModel): no `model.` prefix
            param = params.get(target)
            if param is None:
                unexpected.append(name)
                continue
            module_name, pname = target.rsplit(".", 1)
            module = self.get_submodule(module_name)
            try:
                if hasattr(module, "load_weight"):
                    module.load_weight(pname, param, w, shard_id)
                else:
                    copy_checked(param.data, w, name)
            except ValueError as e:
                raise ValueError(f"checkpoint tensor {name}: {e}") from None
            loaded.add((target, shard_id))
        missing = self._missing(params, loaded) if require_all else []
        if missing:
            shown = ", ".join(missing[:8]) + (f" ... ({len(missing)} in all)" if len(missing) > 8 else "")
            raise ValueError(f"checkpoint is missing weights for {type(self).__name__}: {shown}")
        if unexpected:
            logger.warning("ignored %d unexpected checkpoint tensors, e.g. %s", len(unexpected), unexpected[:4])
        return LoadReport(loaded, unexpected)

    def _missing(self, params: dict[str, nn.Parameter], loaded: set[tuple[str, object]]) -> list[str]:
        missing = []
        for target in params:
            module_name, pname = target.rsplit(".", 1)
            module = self.get_submodule(module_name)
            shards = module.weight_shards(pname) if hasattr(module, "weight_shards") else [None]
            missing += [self._checkpoint_name(target, s) for s in shards if (target, s) not in loaded]
        return missing

    @staticmethod
    def _checkpoint_name(target: str, shard) -> str:
        """Our parameter and shard id, named as the checkpoint's tensor where the shard is a stacked projection."""
        for hf_frag, our_frag, shard_id in STACKED_PARAMS:
            if our_frag in target and shard == shard_id:
                return target.replace(our_frag, hf_frag)
        return target if shard is None else f"{target}[shard {shard}]"
