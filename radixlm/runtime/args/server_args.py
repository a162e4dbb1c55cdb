"""ServerArgs: every knob of the runtime in one typed dataclass. Each field names its section and a one-line help;
the command line (args/parser.py) and docs/server_args.md (radixlm/args_doc.py) are generated from them."""
from __future__ import annotations

import dataclasses
import enum
import logging
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.args.choices import (
    ATTENTION_BACKENDS, DEFAULT_DRAFT_STEPS, DTYPES, EVICTION_POLICIES, GRAMMAR_BACKENDS, LOAD_FORMATS, LORA_BACKENDS,
    HiCachePrefetchPolicy, HiCacheStorageBackend, HiCacheWritePolicy,
    QUANTIZATION_METHODS, REASONING_PARSERS, TOOL_CALL_PARSERS, GrammarMaskMode, JumpForwardMode, KVCacheDtype,
    SchedulePolicyName, Section, SpeculativeAlgorithm, Toggle, TRANSFER_BACKENDS, DisaggregationMode,
)
from radixlm.runtime.args.validate import validate

logger = logging.getLogger(__name__)


def arg(default: Any, section: Section, help: str, *, choices: tuple[str, ...] | None = None,
        sglang_flags: dict[str, Toggle] | None = None) -> Any:
    """A ServerArgs field. `sglang_flags` are SGLang's boolean spellings of a Toggle field (flag -> the value it sets):
    the command line and ServerArgs.from_kwargs accept them."""
    meta = {"section": section, "help": help, "choices": choices, "sglang_flags": sglang_flags or {}}
    return field(default=default, metadata=meta)


M, S, MEM, PAR, K = Section.MODEL, Section.SERVER, Section.MEMORY, Section.PARALLELISM, Section.KERNELS
SPEC, CD, MM, REL = Section.SPECULATIVE, Section.CONSTRAINED, Section.MULTIMODAL, Section.RELIABILITY
LORA, PD = Section.LORA, Section.DISAGGREGATION


@dataclass
class ServerArgs:
    model_path: str = arg("default", M, "HF directory, GGUF file, or an alias: default (SmolLM2-135M-Instruct), "
                                        "qwen2.5-0.5b")
    tokenizer_path: str | None = arg(None, M, "tokenizer directory; unset: the model's own")
    load_format: str = arg("auto", M, "auto, safetensors: read the model's weights; dummy: random weights",
                           choices=LOAD_FORMATS)
    dtype: str = arg("auto", M, "weight and activation dtype; auto: float32 on CPU, the model config's on CUDA",
                     choices=DTYPES)
    quantization: str | None = arg(None, M, "weight quantization; unset: the checkpoint's quantization_config (if "
                                            "any); fp8 / w8a8_fp8 on a float checkpoint quantize it at load "
                                            "(docs/quantization.md)", choices=QUANTIZATION_METHODS)
    context_length: int | None = arg(None, M, "longest sequence, prompt and output; unset: the model config's")
    is_embedding: bool = arg(False, M, "serve the model for pooled outputs (/encode, /v1/embeddings, /v1/rerank) "
                                       "instead of generation")
    device: str = arg("auto", M, "device to run on; auto: cuda when available, else cpu")
    random_seed: int | None = arg(None, M, "seeds sampling and the random schedule policy; unset: sampling draws a "
                                           "seed of its own")

    api_key: str | None = arg(None, S, "require 'Authorization: Bearer KEY' on every route but /health* and /metrics")
    max_queued_requests: int | None = arg(None, S, "reject generation requests (HTTP 503) beyond "
                                                   "max_running_requests + this many; unset: no limit")
    max_logprobs: int = arg(20, S, "most top logprobs a request may ask for per position; -1: the vocabulary size")
    responses_store_size: int = arg(1000, S, "most /v1/responses objects kept in memory for GET, DELETE and "
                                             "previous_response_id (least recently used out first); 0: none")
    stream_interval: int = arg(1, S, "a streaming request reports every this many new tokens (a request's own "
                                     "stream_interval overrides)")
    incremental_streaming_output: bool = arg(False, S, "streamed /generate chunks carry only what is new "
                                                       "instead of everything so far")
    tool_call_parser: str = arg("auto", S, "format of tool calls in the model's text (SGLang's names); auto: the one "
                                                   "the chat template writes, else hermes",
                                choices=TOOL_CALL_PARSERS)
    reasoning_parser: str | None = arg(None, S, "split chat replies into reasoning_content and content by this model "
                                                "family's reasoning format; unset: no split",
                                       choices=REASONING_PARSERS)

    enable_memory_saver: bool = arg(False, MEM, "allow /release_memory_occupation and /resume_memory_occupation: "
                                                "the KV pool and weights leave the device and come back "
                                                "(docs/weights.md)")
    mem_fraction_static: float | None = arg(None, MEM, "share of memory for weights and the KV pool; unset: 0.85 of "
                                                       "the GPU's, 0.05 of the host's on CPU")
    max_total_tokens: int | None = arg(None, MEM, "KV pool size in tokens (overrides --mem-fraction-static)")
    max_running_requests: int | None = arg(None, MEM, "most requests running at once; unset: half the KV pool's "
                                                      "tokens, at most 4096 on CUDA and 256 on CPU")
    page_size: int = arg(1, MEM, "tokens per KV-cache page; the radix cache shares whole pages")
    kv_cache_dtype: KVCacheDtype = arg(KVCacheDtype.AUTO, MEM, "KV cache storage: auto, the model's dtype; fp8_e4m3, "
                                       "fp8_e5m2: float8, per-layer scales (the checkpoint's, else 1); e4m3's CUDA "
                                       "decode rounds q to e4m3")
    schedule_policy: SchedulePolicyName = arg(
        SchedulePolicyName.LPM, MEM, "order of the waiting queue: lpm (longest cached prefix first), dfs-weight "
        "(radix tree depth-first, heavier subtrees first), fcfs, lof (longest output first), random")
    schedule_conservativeness: float = arg(1.0, MEM, "scales the KV kept for running requests' future tokens when "
                                                     "admitting new ones; higher admits fewer, retracts less")
    enable_priority_scheduling: bool = arg(False, MEM, "admit waiting requests by their priority (then the "
                                                       "schedule policy's order) and preempt lower-priority running "
                                                       "ones (docs/scheduling.md)")
    schedule_low_priority_values_first: bool = arg(False, MEM, "a lower priority value is served first (default: "
                                                               "a higher one, as SGLang's)")
    priority_scheduling_preemption_threshold: int = arg(10, MEM, "a waiting request preempts a running one only "
                                                                 "when its priority is higher by more than this")
    default_priority_value: int = arg(0, MEM, "the priority of a request that gives none (SGLang: the lowest)")
    priority_aging_interval: float = arg(10.0, MEM, "seconds of waiting that raise a request's priority by one "
                                                    "(bounds starvation); 0: no aging")
    abort_on_priority_when_disabled: bool = arg(False, MEM, "without --enable-priority-scheduling, fail a request "
                                                            "that gives a priority (HTTP 503) instead of ignoring it")
    max_prefill_tokens: int = arg(16384, MEM, "most prompt tokens one prefill pass admits (its first request is "
                                              "always admitted)")
    chunked_prefill_size: int | None = arg(None, MEM, "longest prompt chunk per prefill pass; -1: no chunking; "
                                                      "unset: 8192 on CUDA, 2048 on CPU")
    mixed_chunk: Toggle = arg(Toggle.AUTO, MEM, "which prefill passes carry the running requests' decode rows: on, "
                              "every one; auto, a whole prefill that fits one CUDA-graph replay; off, none",
                              sglang_flags={"--enable-mixed-chunk": Toggle.ON})
    overlap_schedule: Toggle = arg(Toggle.AUTO, MEM, "launch each batch before the previous batch's results are "
                                   "processed; auto: on CUDA only",
                                   sglang_flags={"--disable-overlap-schedule": Toggle.OFF})
    disable_radix_cache: bool = arg(False, MEM, "no prefix reuse: every prompt is prefilled from its first token")
    radix_eviction_policy: str = arg("lru", MEM, "which unused cached prefixes are evicted first",
                                     choices=EVICTION_POLICIES)
    enable_hierarchical_cache: bool = arg(False, MEM, "keep prefixes evicted from the device KV pool in a host "
                                                      "memory pool (and on disk with --hicache-storage-backend); a "
                                                      "hit there is loaded back (docs/hicache.md)")
    hicache_ratio: float = arg(2.0, MEM, "host KV pool size as a multiple of the device pool's (>= 1)")
    hicache_size: float = arg(0.0, MEM, "host KV pool size in GB; > 0 overrides --hicache-ratio")
    hicache_write_policy: HiCacheWritePolicy = arg(
        HiCacheWritePolicy.WRITE_THROUGH, MEM, "when a cached prefix is copied to the host pool: write_through, once "
        "cached; write_through_selective, at its second hit; write_back, at its device eviction")
    hicache_storage_backend: HiCacheStorageBackend | None = arg(
        None, MEM, "a tier under the host pool: file (a file per page, keyed by a hash of its token prefix, in "
        "$SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR; kept across restarts)")
    hicache_storage_prefetch_policy: HiCachePrefetchPolicy = arg(
        HiCachePrefetchPolicy.BEST_EFFORT, MEM, "how long admission waits for pages read from storage: best_effort, "
        "what has arrived; wait_complete, all found; timeout, all found within a bound")

    tp_size: int = arg(1, PAR, "tensor-parallel ranks, one process and one GPU each (gloo on CPU)")
    ep_size: int = arg(1, PAR, "expert-parallel ranks for MoE models: 1 (experts sliced over the TP ranks) or "
                               "--tp-size (whole experts per rank)")
    dp_size: int = arg(1, PAR, "data-parallel replicas behind a router (radixlm serve)")
    nnodes: int = arg(1, PAR, "hosts the tensor-parallel ranks span")
    node_rank: int = arg(0, PAR, "this host's index; the HTTP server runs on node 0")
    dist_init_addr: str | None = arg(None, PAR, "host:port of node 0, where the ranks meet (needed with --nnodes > 1)")
    base_gpu_id: int = arg(0, PAR, "first GPU this server's ranks use")
    dist_timeout: float = arg(300.0, PAR, "seconds a collective waits for the other ranks before the server fails")
    disable_custom_all_reduce: bool = arg(False, PAR, "all-reduce through NCCL only, never through symmetric memory "
                                                      "over NVLink")
    disable_allreduce_fusion: bool = arg(False, PAR, "run a layer's all-reduce and the residual add and RMSNorm "
                                                     "after it as separate kernels (fused: one kernel over "
                                                     "symmetric memory, up to 256 rows)")

    attention_backend: str = arg("auto", K, "attention kernels; auto: triton on CUDA, torch_native elsewhere",
                                 choices=ATTENTION_BACKENDS)
    disable_cuda_graph: bool = arg(False, K, "run decode eagerly instead of replaying CUDA graphs")
    cuda_graph_max_bs: int | None = arg(None, K, "largest pass, in rows, replayed from a CUDA graph; unset: "
                                                 "min(16 x max_running_requests, 1024)")
    disable_tuned_gemm: bool = arg(False, K, "run decode GEMMs through torch's cuBLAS call instead of this GPU "
                                             "model's tuned cuBLASLt configurations")
    enable_deterministic_inference: bool = arg(
        False, K, "batch-invariant GEMMs and attention: a request's tokens and logprobs do not depend on its batch, "
        "cache hits or chunking (docs/determinism.md)")
    disable_shared_prefix_decode: bool = arg(False, K, "eager decode passes read a prefix that several running "
                                                       "requests share once per request (no cascade attention)")

    speculative_algorithm: SpeculativeAlgorithm | None = arg(
        None, SPEC, "draft source: NGRAM (prompt lookup), RADIX (the radix cache), NGRAM_RADIX (both), STANDALONE "
        "(a draft model), EAGLE, EAGLE3 (an EAGLE head); unset: no drafting")
    speculative_num_draft_tokens: int | None = arg(
        None, SPEC, "tokens one verify pass holds per request, the newest accepted one counted (>= 2); unset: "
        "--speculative-num-steps + 1 where given, else 5")
    speculative_num_steps: int | None = arg(
        None, SPEC, "STANDALONE, EAGLE: draft passes per step (a chain's length, a tree's depth); unset: "
        "--speculative-num-draft-tokens - 1, else 4")
    speculative_draft_model_path: str | None = arg(
        None, SPEC, "STANDALONE: the draft model (the target's tokenizer); EAGLE: the head's directory (unset: "
        "the target's own MTP layer, DeepSeek-V3)")
    speculative_eagle_topk: int = arg(1, SPEC, "EAGLE: branches per draft step; 1 drafts a chain, more a tree "
                                               "verified in one pass")
    speculative_ngram_min_match_window_size: int = arg(2, SPEC, "NGRAM: shortest run of latest tokens looked up")
    speculative_ngram_max_match_window_size: int = arg(4, SPEC, "NGRAM: longest run of latest tokens looked up "
                                                                "(longest match first)")
    speculative_radix_match_window_size: int = arg(4, SPEC, "RADIX: latest tokens looked up in the cache's k-gram "
                                                            "index when the whole sequence is not cached")
    speculative_max_batch_rows: int = arg(64, SPEC, "rows a decode pass may reach with drafts: (rows - batch) // "
                                                    "batch tokens per request; 0: no limit")
    speculative_measure_window: int = arg(8, SPEC, "decode steps per timing of drafting on against off, which turns "
                                                   "drafting off per batch size where off is faster; 0: never")

    grammar_backend: str = arg("xgrammar", CD, "compiles regex, json_schema and ebnf constraints",
                               choices=GRAMMAR_BACKENDS)
    jump_forward: JumpForwardMode = arg(JumpForwardMode.OFF, CD, "text a grammar forces: off, decoded token by "
                                        "token; fast, appended as retokenized; exact, drafted and verified")
    grammar_mask: GrammarMaskMode = arg(GrammarMaskMode.ON_DEMAND, CD, "on_demand: a greedy request's mask is "
                                        "filled only when the grammar refuses its argmax; always: every step")

    mm_encoder_cache_mb: int = arg(1024, MM, "MiB of encoder outputs kept by content hash, so a chunked prefill "
                                             "encodes an image once")
    allowed_local_media_path: str | None = arg(None, MM, "directory media files may be read from (paths, file:// "
                                                         "URLs); unset: local files are refused")
    allowed_media_domains: list[str] | None = arg(None, MM, "hosts (and their subdomains) http(s) media URLs may "
                                                            "come from; unset: any host")
    media_fetch_timeout: float = arg(10.0, MM, "seconds to fetch one http(s) media URL")
    max_media_bytes: int = arg(20 << 20, MM, "largest media item accepted, in bytes after base64 decoding")

    enable_lora: bool = arg(False, LORA, "serve LoRA adapters (set by --lora-paths too)")
    lora_paths: list[str] | None = arg(None, LORA, "adapters loaded at start: NAME=PATH, PATH (named by its path) "
                                                   "or JSON {\"lora_name\": .., \"lora_path\": .., \"pinned\": ..}")
    max_loras_per_batch: int = arg(8, LORA, "adapters one batch may use (the device slots of adapter weights)")
    max_lora_rank: int | None = arg(None, LORA, "largest adapter rank accepted; unset: the largest of --lora-paths' "
                                                "adapters, else 64")
    lora_target_modules: list[str] | None = arg(None, LORA, "modules adapters may target (q_proj k_proj v_proj "
                                                            "o_proj gate_proj up_proj down_proj, or all); unset: "
                                                            "--lora-paths' adapters' targets, else all")
    lora_backend: str = arg("triton", LORA, "batched LoRA kernels: triton (on CUDA its Triton kernels, eager passes and "
                                            "the decode CUDA graphs alike; the torch path elsewhere) or "
                                            "torch_native (passes run eagerly)", choices=LORA_BACKENDS)
    max_loaded_loras: int | None = arg(None, LORA, "most adapters held in host memory at once (>= "
                                                   "--max-loras-per-batch); unset: no limit")

    disaggregation_mode: DisaggregationMode = arg(
        DisaggregationMode.NULL, PD, "prefill: prefill requests with a bootstrap room, hand their KV on; decode: take "
        "it and decode; null: a plain server (docs/disaggregation.md)")
    disaggregation_bootstrap_port: int = arg(8998, PD, "prefill: the port of the bootstrap server decode servers "
                                                       "take the KV from")
    disaggregation_transfer_backend: str = arg("zmq", PD, "how KV pages move: zmq (TCP, no other setting); "
                                                          "mooncake, nixl: refused at start (docs/disaggregation.md)",
                                               choices=TRANSFER_BACKENDS)
    disaggregation_timeout: float = arg(300.0, PD, "decode: seconds to wait for a room's KV before the request "
                                                   "fails; prefill: seconds an unclaimed room's KV is kept")

    watchdog_timeout: float = arg(300.0, REL, "seconds without scheduler progress, requests pending, before they "
                                              "are failed")
    req_waiting_timeout: float | None = arg(None, REL, "seconds a request may wait before its first prefill; "
                                                       "later, it is aborted (HTTP 503); 0: no limit; unset: "
                                                       "$SGLANG_REQ_WAITING_TIMEOUT, else no limit")
    req_running_timeout: float | None = arg(None, REL, "seconds a request may run from its first prefill; later, "
                                                       "it is aborted (HTTP 503); 0: no limit; unset: "
                                                       "$SGLANG_REQ_RUNNING_TIMEOUT, else no limit")
    enable_integrity_check: bool = arg(False, REL, "check the KV-cache accounting after every scheduler step")
    log_level: str = arg("info", REL, "logging level: debug, info, warning, error or critical")

    def __post_init__(self) -> None:
        for name, kind in ENUM_FIELDS.items():
            value = getattr(self, name)
            if not isinstance(value, kind) and value in {m.value for m in kind}:
                setattr(self, name, kind(value))
        if self.lora_paths:
            self.enable_lora = True  # SGLang's rule: --lora-paths alone turns LoRA on
        validate(self)
        if self.speculative_algorithm is not None:
            self._resolve_draft_tokens()

    @property
    def drafts_with_model(self) -> bool:
        algo = self.speculative_algorithm
        return algo is SpeculativeAlgorithm.STANDALONE or (algo is not None and algo.is_eagle)

    def _resolve_draft_tokens(self) -> None:
        """SGLang's --speculative-num-draft-tokens: the verify pass's tokens per request, the root (the newest accepted
        token) counted, so a step drafts at most N - 1. A draft model's chain (topk 1) has N = steps + 1, as SGLang
        forces it; unset, N is steps + 1 (steps: N - 1 where N is given, else DEFAULT_DRAFT_STEPS)."""
        model = self.drafts_with_model
        n, steps = self.speculative_num_draft_tokens, self.speculative_num_steps
        # A value of 1 drafts nothing; where SGLang's topk 1 rule replaces it by steps + 1, it is adjusted below.
        if n is not None and n < 2 and not (model and self.speculative_eagle_topk == 1 and steps is not None):
            raise ValueError(f"speculative_num_draft_tokens must be >= 2 (got {n}): it counts the verified root "
                             "token too, as SGLang's does, so a step drafts at most speculative_num_draft_tokens - 1 "
                             "tokens")
        if model and steps is None:
            steps = self.speculative_num_steps = DEFAULT_DRAFT_STEPS if n is None else n - 1
        if n is None:
            n = DEFAULT_DRAFT_STEPS + 1 if steps is None else steps + 1
        elif model and self.speculative_eagle_topk == 1 and n != steps + 1:
            logger.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 = %d (was %d): "
                           "with speculative_eagle_topk 1 a chain of speculative_num_steps drafted tokens and its "
                           "root are verified", steps + 1, n)
            n = steps + 1
        self.speculative_num_draft_tokens = n

    @property
    def max_draft_tokens(self) -> int:
        """Tokens a request drafts per step at most (SGLang's --speculative-num-draft-tokens less the root); 0 without
        speculation. A tree's drafted nodes."""
        n = self.speculative_num_draft_tokens
        return 0 if self.speculative_algorithm is None or n is None else n - 1

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @classmethod
    def from_kwargs(cls, **kwargs) -> "ServerArgs":
        """Keyword construction that names unknown arguments and takes SGLang's boolean spellings of Toggle fields
        (disable_overlap_schedule=True, enable_mixed_chunk=True)."""
        names = {f.name for f in dataclasses.fields(cls)}
        for spelling, (name, value) in SGLANG_KWARGS.items():
            if kwargs.pop(spelling, False):
                if name in kwargs:
                    raise ValueError(f"give {name} or {spelling}, not both")
                kwargs[name] = value
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"unknown server argument(s): {', '.join(unknown)}")
        return cls(**kwargs)


def _enum_fields() -> dict[str, type[enum.Enum]]:
    out = {}
    for name, tp in typing.get_type_hints(ServerArgs).items():
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            out[name] = tp
    return out


# ServerArgs fields whose values are enums: a string given for them becomes the member.
ENUM_FIELDS: dict[str, type[enum.Enum]] = _enum_fields()
# SGLang's keyword for a Toggle field -> (the field, the value that keyword's True sets).
SGLANG_KWARGS: dict[str, tuple[str, Toggle]] = {
    flag[2:].replace("-", "_"): (f.name, value)
    for f in dataclasses.fields(ServerArgs) for flag, value in f.metadata["sglang_flags"].items()
}
