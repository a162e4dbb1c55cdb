"""Qwen3: Llama layout plus a per-head RMSNorm on q and k before rotary; `attention_bias` covers q, k, v, o."""
from __future__ import annotations

from radixlm.runtime.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
