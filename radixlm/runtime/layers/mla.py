"""Multi-head latent attention (DeepSeek-V2/V3 MLA) as a model layer, always in the absorbed form.

Per token: q from q_proj (V2-Lite) or q_a_proj -> q_a_layernorm -> q_b_proj (the q LoRA), per head [q_nope | q_pe];
kv_a_proj_with_mqa gives [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)], c_kv through kv_a_layernorm; q_pe and k_pe
take the rotary embedding (interleaved pairs). The cache stores [c_kv | k_pe] per token (one row shared by all heads).
kv_b_proj (W_UK for the keys' nope part, W_UV for the values) is never applied to the cache: q_nope is projected by
W_UK into the latent space, attention runs over the latent rows (layers.attention.mla.latent_attention), and its
latent output is projected by W_UV, then o_proj.

Tensor parallelism splits the heads (q_proj / q_b_proj, kv_b_proj, o_proj's input); q_a_proj, kv_a_proj_with_mqa and
their norms are replicated, and so is the latent cache. With a q LoRA, q_a_proj and kv_a_proj_with_mqa are one GEMM
(fused_qkv_a_proj_with_mqa, as SGLang names it), so the input norm is handed to that one GEMM."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.kernels.gemm import Prologue, apply_prologue
from radixlm.runtime.layers.attention.mla import latent_attention
from radixlm.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Shard, copy_checked
from radixlm.runtime.layers.norm import RMSNorm
from radixlm.runtime.layers.rotary import RotaryEmbedding, yarn_get_mscale

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from radixlm.runtime.executor.forward_batch import ForwardBatch

# transformers' DeepSeek q_a_layernorm / kv_a_layernorm take the RMSNorm default, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def mla_softmax_scale(config: "PretrainedConfig", rope_scaling: dict | None) -> float:
    """qk_head_dim ** -0.5, times yarn_get_mscale(factor, mscale_all_dim) squared under a scaled rope (DeepSeek's
    correction of the softmax for YaRN, as transformers' yarn_apply_mscale)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type", "default")) != "default":
        mscale_all_dim = rope_scaling.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = yarn_get_mscale(float(rope_scaling["factor"]), float(mscale_all_dim))
            scale *= m * m
    return scale


class LatentUpProjection(nn.Module):
    """kv_b_proj: c_kv -> per head [k_nope (qk_nope_head_dim) | v (v_head_dim)], this rank's heads. Loaded from the
    checkpoint's (heads * (nope + v), kv_lora_rank) tensor as one (local heads, nope + v, kv_lora_rank) weight, split
    there into its two parts: w_uk (heads, nope, rank) and w_uv (heads, v, rank), views that follow any weight
    update in place. A checkpoint that quantizes it (DeepSeek-V3's FP8 blocks) loads through `quant_method`
    (quantization/modules.DequantizedAtLoad, set by quantize_modules), which leaves the float weight once loaded."""

    quant_method = None

    def __init__(self, num_heads: int, qk_nope_head_dim: int, v_head_dim: int, kv_lora_rank: int,
                 parallel: Parallel = SINGLE):
        super().__init__()
        per_head = qk_nope_head_dim + v_head_dim
        self.shard = Shard.heads(num_heads, per_head, parallel, "num_attention_heads")
        self.num_heads = self.shard.local // per_head
        self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank = qk_nope_head_dim, v_head_dim, kv_lora_rank
        self.weight = nn.Parameter(torch.empty(self.num_heads, per_head, kv_lora_rank), requires_grad=False)

    @property
    def w_uk(self) -> torch.Tensor:
        return self.weight[:, : self.qk_nope_head_dim]

    @property
    def w_uv(self) -> torch.Tensor:
        return self.weight[:, self.qk_nope_head_dim :]

    def weight_shards(self, pname: str) -> list:
        if self.quant_method is not None:
            return self.quant_method.weight_shards(self, pname)
        return [None]

    def checkpoint_shape(self, pname: str, shard_id) -> tuple[int, ...]:
        if self.quant_method is not None:
            return self.quant_method.checkpoint_shape(self, pname, shard_id)
        return self.shard.full, self.kv_lora_rank

    def load_weight(self, pname: str, param: nn.Parameter, w, shard_id) -> None:
        if self.quant_method is not None:
            return self.quant_method.load_weight(self, pname, param, w, shard_id)
        if tuple(w.shape) != self.checkpoint_shape(pname, shard_id):
            raise ValueError(f"weight {pname} has shape {tuple(w.shape)}, "
                             f"expected {self.checkpoint_shape(pname, shard_id)}")
        rows = w[self.shard.start : self.shard.start + self.shard.local]
        copy_checked(param.data, rows.reshape(param.shape), pname)

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, nope={self.qk_nope_head_dim}, v={self.v_head_dim}, "
                f"rank={self.kv_lora_rank}")


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, config: "PretrainedConfig", layer_id: int, rotary_emb: RotaryEmbedding, scaling: float,
                 parallel: Parallel = SINGLE):
        super().__init__()
        self.layer_id = layer_id
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.q_lora_rank = getattr(config, "q_lora_rank", None)
        if rotary_emb.head_size != self.qk_rope_head_dim:
            raise ValueError(f"the rotary embedding's head size {rotary_emb.head_size} is not qk_rope_head_dim "
                             f"{self.qk_rope_head_dim}")
        hidden, heads = config.hidden_size, config.num_attention_heads
        bias = bool(getattr(config, "attention_bias", False))
        qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        if heads < parallel.tp_size:  # o_proj's input is split: every rank needs heads of its own
            raise ValueError(f"num_attention_heads ({heads}) is less than the tensor-parallel size {parallel.tp_size}")
        q = Shard.heads(heads, qk_head_dim, parallel, "num_attention_heads")
        self.num_heads = q.local // qk_head_dim
        latent = self.kv_lora_rank + self.qk_rope_head_dim
        if self.q_lora_rank is not None:
            self.fused_qkv_a_proj_with_mqa = ColumnParallelLinear(
                hidden, [Shard(self.q_lora_rank, self.q_lora_rank, 0), Shard(latent, latent, 0)], bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, [q])
        else:
            self.q_proj = ColumnParallelLinear(hidden, [q])
            # Replicated, as a column-parallel layer of one whole shard: a format quantizes it (as the fused one).
            self.kv_a_proj_with_mqa = ColumnParallelLinear(hidden, [Shard(latent, latent, 0)], bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = LatentUpProjection(heads, self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank, parallel)
        self.o_proj = RowParallelLinear(heads * self.v_head_dim, hidden, bias=bias, parallel=parallel)
        self.rotary_emb = rotary_emb
        if not (scaling > 0 and math.isfinite(scaling)):
            raise ValueError(f"the softmax scale must be positive and finite, got {scaling}")
        self.scaling = scaling

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: "ForwardBatch",
                prologue: Prologue | None = None, reduce: bool = True) -> torch.Tensor:
        """prologue: hidden before its norm (handed to the first GEMM, which sets its residual_out). reduce=False:
        o_proj's partial sum (tensor parallel), left to the next norm."""
        t, h = hidden.shape[0], self.num_heads
        nope, rope, rank = self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        if self.q_lora_rank is not None:
            q_a, latent = self.fused_qkv_a_proj_with_mqa(hidden, prologue).split([self.q_lora_rank, rank + rope], -1)
            q = self.q_b_proj(self.q_a_layernorm(q_a.contiguous()))
        else:
            hidden = apply_prologue(prologue, hidden)
            q, latent = self.q_proj(hidden), self.kv_a_proj_with_mqa(hidden)
        q_nope, q_pe = q.view(t, h, nope + rope).split([nope, rope], dim=-1)
        c_kv, k_pe = latent.split([rank, rope], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv.contiguous())
        q_pe, k_pe = self.rotary_emb(positions, q_pe.reshape(t, h * rope), k_pe.contiguous())
        pool = forward_batch.token_to_kv_pool
        if forward_batch.layer_loads is not None:  # KV loaded back into the pool: this layer's has arrived
            forward_batch.layer_loads.wait(self.layer_id)
        pool.set_mla_kv_buffer(self.layer_id, forward_batch.out_cache_loc, c_kv, k_pe)
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.kv_b_proj.w_uk).transpose(0, 1)  # (t, h, rank)
        q_all = torch.cat([q_latent, q_pe.view(t, h, rope)], dim=-1)
        o = latent_attention(q_all, pool.get_latent_buffer(self.layer_id), forward_batch, self.scaling, rank)
        o = torch.bmm(o.transpose(0, 1), self.kv_b_proj.w_uv.transpose(1, 2))  # (h, t, v)
        return self.o_proj(o.transpose(0, 1).reshape(t, h * self.v_head_dim), reduce=reduce)
