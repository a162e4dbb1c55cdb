"""Qwen2 / Qwen2.5: Llama layout with a bias on q, k, v (not on o_proj); tied or untied head."""
from __future__ import annotations

from radixlm.runtime.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias_default = True
    o_bias_follows_attention_bias = False
