"""The closed sets ServerArgs draws from: modes as enums, value lists as tuples, and the sections of its flags."""
from __future__ import annotations

import enum

from radixlm.runtime.parsers.tool_calls import registry as tool_call_registry
from radixlm.runtime.parsers import reasoning as _reasoning


class Section(enum.Enum):
    """The heading a flag appears under in `--help` and docs/server_args.md (definition order is display order)."""
    MODEL = "Model and tokenizer"
    SERVER = "Server and HTTP API"
    MEMORY = "Memory and scheduling"
    PARALLELISM = "Parallelism"
    KERNELS = "Kernels and CUDA graphs"
    SPECULATIVE = "Speculative decoding"
    CONSTRAINED = "Constrained decoding"
    MULTIMODAL = "Multimodal inputs"
    LORA = "LoRA adapters"
    DISAGGREGATION = "Prefill/decode disaggregation"
    RELIABILITY = "Reliability and observability"


class Toggle(str, enum.Enum):
    """A feature that is on, off, or left to the server to decide (see each flag's help for what auto picks)."""
    AUTO = "auto"
    ON = "on"
    OFF = "off"

    def resolve(self, auto: bool) -> bool:
        """Whether the feature is on, `auto` standing for the server's own choice."""
        return auto if self is Toggle.AUTO else self is Toggle.ON


class SchedulePolicyName(str, enum.Enum):
    LPM = "lpm"  # longest prefix match first (the paper's cache-aware order)
    DFS_WEIGHT = "dfs-weight"  # depth-first over the radix tree, heavier subtrees first
    FCFS = "fcfs"
    LOF = "lof"  # longest output first
    RANDOM = "random"


class JumpForwardMode(str, enum.Enum):
    OFF = "off"
    FAST = "fast"  # the paper's: forced text appended as retokenized (its tokenization may differ)
    EXACT = "exact"  # forced text drafted and verified: greedy output identical to off


class DisaggregationMode(str, enum.Enum):
    """SGLang's --disaggregation-mode: a server that only prefills (and hands the KV on), only decodes (and receives
    it), or does both (null)."""
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


# How KV pages move between a prefill and a decode server (radixlm/runtime/disaggregation/): zmq, our own over TCP;
# mooncake and nixl (SGLang's), checked at start: neither runs on a machine without RDMA / CUDA (docs/disaggregation.md).
TRANSFER_BACKENDS = ("zmq", "mooncake", "nixl")


class GrammarMaskMode(str, enum.Enum):
    ON_DEMAND = "on_demand"  # a greedy row's mask is filled only when the grammar refuses the model's argmax
    ALWAYS = "always"


class SpeculativeAlgorithm(str, enum.Enum):
    NGRAM = "NGRAM"  # prompt lookup: the request's own earlier tokens continue its latest ones
    RADIX = "RADIX"  # what the radix cache holds after the request's tokens (spec/sources/radix.py)
    NGRAM_RADIX = "NGRAM_RADIX"  # both: the cache's continuation of the whole sequence, prompt lookup, the cache's k-gram
    STANDALONE = "STANDALONE"  # a small draft model with the same tokenizer (spec/sources/model.py)
    EAGLE = "EAGLE"  # an EAGLE head over the target's hidden states (spec/runners/eagle.py)
    EAGLE3 = "EAGLE3"  # the same: the head's config tells EAGLE-1 from EAGLE-3 (SGLang's name for the latter)

    @property
    def is_eagle(self) -> bool:
        return self in (SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.EAGLE3)


class KVCacheDtype(str, enum.Enum):
    """What the KV pool stores (SGLang's --kv-cache-dtype spellings)."""
    AUTO = "auto"  # the model's dtype
    FP8_E4M3 = "fp8_e4m3"  # float8 e4m3 (torch.float8_e4m3fn), per-layer K and V scales
    FP8_E5M2 = "fp8_e5m2"  # float8 e5m2: more range, fewer mantissa bits

    @property
    def is_fp8(self) -> bool:
        return self is not KVCacheDtype.AUTO


class HiCacheWritePolicy(str, enum.Enum):
    """When a radix node's KV is copied from the device pool to the host pool (SGLang's --hicache-write-policy)."""
    WRITE_BACK = "write_back"  # at its eviction from the device
    WRITE_THROUGH = "write_through"  # when it enters the tree
    WRITE_THROUGH_SELECTIVE = "write_through_selective"  # at its second hit

    @property
    def hit_threshold(self) -> int | None:
        """Hits after which a node is copied to the host (None: only at eviction)."""
        return {HiCacheWritePolicy.WRITE_THROUGH: 1, HiCacheWritePolicy.WRITE_THROUGH_SELECTIVE: 2}.get(self)


class HiCacheStorageBackend(str, enum.Enum):
    FILE = "file"  # one file per page under SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR


class HiCachePrefetchPolicy(str, enum.Enum):
    """How long admission waits for pages read from storage (SGLang's --hicache-storage-prefetch-policy)."""
    BEST_EFFORT = "best_effort"  # what has arrived by admission time
    WAIT_COMPLETE = "wait_complete"  # every page found
    TIMEOUT = "timeout"  # every page found, waiting at most a bound


def values(kind: type[enum.Enum]) -> tuple[str, ...]:
    return tuple(m.value for m in kind)


# Tokens drafted per step where neither --speculative-num-draft-tokens nor --speculative-num-steps says (radixlm's
# default so far): --speculative-num-draft-tokens DEFAULT_DRAFT_STEPS + 1, as SGLang counts it.
DEFAULT_DRAFT_STEPS = 4
# A pass's requests index a CUDA grid axis of the attention kernels, which holds at most 65535.
MAX_RUNNING_REQUESTS = 65535
# A request's priority (and --default-priority-value) is within +-this: a signed 64-bit value, with room for aging.
MAX_PRIORITY = (1 << 62) - 1

SCHEDULE_POLICIES = values(SchedulePolicyName)
EVICTION_POLICIES = ("lru", "lfu", "fifo")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# runtime.quantization.QuantizationMethod's values (tests/runtime/quantization checks they agree)
QUANTIZATION_METHODS = ("fp8", "w8a8_fp8", "awq", "gptq", "compressed-tensors", "w8a8_int8", "modelopt", "awq_marlin",
                        "gptq_marlin", "moe_wna16", "modelopt_fp8")
ATTENTION_BACKENDS = ("auto", "torch_native", "triton")
GRAMMAR_BACKENDS = ("xgrammar",)
JUMP_FORWARD_MODES = values(JumpForwardMode)
GRAMMAR_MASK_MODES = values(GrammarMaskMode)
TOGGLES = values(Toggle)
TOOL_CALL_PARSERS = tool_call_registry.TOOL_CALL_PARSERS  # SGLang's --tool-call-parser names and auto

REASONING_PARSERS = _reasoning.REASONING_PARSERS  # SGLang's --reasoning-parser names
# PEFT's module names a LoRA adapter may target (the fused qkv_proj and gate_up_proj take q/k/v and gate/up).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_LORA_RANK = 64
LORA_BACKENDS = ("triton", "torch_native")
