"""ServerArgs' range and consistency checks: each failure is a ValueError naming the field."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from radixlm.runtime.args.choices import (
    ATTENTION_BACKENDS, DTYPES, EVICTION_POLICIES, GRAMMAR_BACKENDS, LOAD_FORMATS, LORA_BACKENDS, LORA_TARGET_MODULES,
    MAX_LORA_RANK, MAX_PRIORITY, MAX_RUNNING_REQUESTS, QUANTIZATION_METHODS, REASONING_PARSERS, TOOL_CALL_PARSERS,
    SpeculativeAlgorithm, values,
)

if TYPE_CHECKING:
    from radixlm.runtime.args.server_args import ServerArgs


def _is_host_port(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_choices(a: ServerArgs) -> None:
    from radixlm.runtime.args.server_args import ENUM_FIELDS

    for name, kind in ENUM_FIELDS.items():
        value = getattr(a, name)
        optional = type(a).__dataclass_fields__[name].default is None
        _check(isinstance(value, kind) or (value is None and optional),
               f"unknown {name} {value!r}; choose from {values(kind)}")
    for name, allowed in (("radix_eviction_policy", EVICTION_POLICIES), ("load_format", LOAD_FORMATS),
                          ("dtype", DTYPES), ("attention_backend", ATTENTION_BACKENDS),
                          ("grammar_backend", GRAMMAR_BACKENDS), ("tool_call_parser", TOOL_CALL_PARSERS),
                          ("lora_backend", LORA_BACKENDS)):
        value = getattr(a, name)
        _check(value in allowed, f"unknown {name} {value!r}; choose from {allowed}")
    _check(a.quantization is None or a.quantization in QUANTIZATION_METHODS,
           f"unknown quantization {a.quantization!r}; choose from {QUANTIZATION_METHODS}")
    _check(a.reasoning_parser is None or a.reasoning_parser in REASONING_PARSERS,
           f"unknown reasoning_parser {a.reasoning_parser!r}; choose from {REASONING_PARSERS}")


def _check_memory_and_scheduling(a: ServerArgs) -> None:
    _check(a.page_size >= 1, "page_size must be >= 1")
    _check(a.max_prefill_tokens >= 1, "max_prefill_tokens must be >= 1")
    _check(a.max_total_tokens is None or a.max_total_tokens >= 1, "max_total_tokens must be >= 1")
    _check(a.max_running_requests is None or 1 <= a.max_running_requests <= MAX_RUNNING_REQUESTS,
           f"max_running_requests must be in [1, {MAX_RUNNING_REQUESTS}]")
    _check(a.mem_fraction_static is None or 0 < a.mem_fraction_static < 1, "mem_fraction_static must be in (0, 1)")
    _check(a.chunked_prefill_size is None or a.chunked_prefill_size == -1 or a.chunked_prefill_size >= a.page_size,
           "chunked_prefill_size must be -1 (off) or >= page_size")
    _check(a.max_queued_requests is None or a.max_queued_requests >= 0, "max_queued_requests must be >= 0")
    _check(a.stream_interval >= 1, "stream_interval must be >= 1")
    _check(a.responses_store_size >= 0, "responses_store_size must be >= 0")
    _check(a.schedule_conservativeness > 0, "schedule_conservativeness must be > 0")
    _check(a.max_logprobs >= -1, "max_logprobs must be -1 (the vocabulary size) or >= 0")
    _check(a.hicache_ratio >= 1.0, "hicache_ratio must be >= 1 (the host pool holds at least the device pool)")
    _check(a.hicache_size >= 0, "hicache_size must be >= 0 (GB; 0: use hicache_ratio)")
    _check(a.enable_hierarchical_cache or a.hicache_storage_backend is None,
           "hicache_storage_backend needs enable_hierarchical_cache")
    _check(not a.enable_hierarchical_cache or not a.disable_radix_cache,
           "enable_hierarchical_cache needs the radix cache (drop disable_radix_cache)")
    _check(a.hicache_storage_backend is None or a.tp_size == 1,
           "hicache_storage_backend needs tp_size 1 (ranks would see storage reads at different times)")
    _check(a.priority_scheduling_preemption_threshold >= 0, "priority_scheduling_preemption_threshold must be >= 0")
    _check(a.priority_aging_interval >= 0 and math.isfinite(a.priority_aging_interval),
           "priority_aging_interval must be a finite number >= 0 (0: no aging)")
    _check(abs(a.default_priority_value) <= MAX_PRIORITY, f"default_priority_value must be in [-{MAX_PRIORITY}, "
                                                          f"{MAX_PRIORITY}]")
    _check(a.cuda_graph_max_bs is None or a.cuda_graph_max_bs >= 1, "cuda_graph_max_bs must be >= 1")


def _check_speculative(a: ServerArgs) -> None:
    _check(1 <= a.speculative_ngram_min_match_window_size <= a.speculative_ngram_max_match_window_size,
           "need 1 <= speculative_ngram_min_match_window_size <= speculative_ngram_max_match_window_size")
    _check(a.speculative_radix_match_window_size >= 1, "speculative_radix_match_window_size must be >= 1")
    _check(a.speculative_max_batch_rows >= 0, "speculative_max_batch_rows must be >= 0 (0: no limit)")
    _check(a.speculative_measure_window >= 0, "speculative_measure_window must be >= 0 (0: no measuring)")
    _check(a.speculative_num_steps is None or a.speculative_num_steps >= 1, "speculative_num_steps must be >= 1")
    algo = a.speculative_algorithm
    # EAGLE without a path drafts with the target's own MTP layer (spec/mtp.py checks, at load, that it has one).
    _check(not a.drafts_with_model or a.speculative_draft_model_path is not None
           or algo is SpeculativeAlgorithm.EAGLE,
           f"--speculative-algorithm {getattr(algo, 'value', '')} needs --speculative-draft-model-path")
    _check(not a.drafts_with_model or a.tp_size == 1, "a draft model (STANDALONE, EAGLE) runs with tp_size 1 only")
    _check(a.speculative_eagle_topk >= 1, "speculative_eagle_topk must be >= 1")
    _check(a.speculative_eagle_topk == 1 or (algo is not None and algo.is_eagle),
           "speculative_eagle_topk > 1 (tree drafts) needs --speculative-algorithm EAGLE or EAGLE3")
    _check(not (a.enable_memory_saver and a.drafts_with_model),
           "--enable-memory-saver releases the served model's memory only: it cannot run with a draft model "
           "(--speculative-algorithm STANDALONE, EAGLE, EAGLE3)")


def _check_parallelism(a: ServerArgs) -> None:
    _check(a.tp_size >= 1, "tp_size must be >= 1")
    _check(a.ep_size in (1, a.tp_size), f"ep_size must be 1 or equal to tp_size ({a.tp_size})")
    _check(a.dp_size >= 1, "dp_size must be >= 1")
    _check(a.nnodes >= 1 and a.tp_size % a.nnodes == 0, "tp_size must be a multiple of nnodes")
    _check(0 <= a.node_rank < a.nnodes, "node_rank must be in [0, nnodes)")
    _check(a.nnodes == 1 or a.dist_init_addr is not None, "--nnodes > 1 needs --dist-init-addr host:port")
    _check(a.dist_init_addr is None or _is_host_port(a.dist_init_addr), "dist_init_addr must be host:port")
    _check(a.base_gpu_id >= 0, "base_gpu_id must be >= 0")
    _check(a.dist_timeout > 0, "dist_timeout must be > 0")


def _check_serving(a: ServerArgs) -> None:
    _check(a.watchdog_timeout > 0, "watchdog_timeout must be > 0")
    for name in ("req_waiting_timeout", "req_running_timeout"):
        value = getattr(a, name)
        _check(value is None or (value >= 0 and math.isfinite(value)), f"{name} must be a finite number >= 0 (0: no "
                                                                        "limit)")
    _check(a.mm_encoder_cache_mb >= 0, "mm_encoder_cache_mb must be >= 0")
    _check(a.media_fetch_timeout > 0, "media_fetch_timeout must be > 0")
    _check(a.max_media_bytes >= 1, "max_media_bytes must be >= 1")
    _check(not a.is_embedding or a.speculative_algorithm is None,
           "--is-embedding runs prefill only: it takes no --speculative-algorithm")


def _check_lora(a: ServerArgs) -> None:
    _check(a.max_loras_per_batch >= 1, "max_loras_per_batch must be >= 1")
    _check(a.max_lora_rank is None or 1 <= a.max_lora_rank <= MAX_LORA_RANK,
           f"max_lora_rank must be in [1, {MAX_LORA_RANK}]")
    _check(a.max_loaded_loras is None or a.max_loaded_loras >= a.max_loras_per_batch,
           "max_loaded_loras must be >= max_loras_per_batch")
    allowed = (*LORA_TARGET_MODULES, "all")
    bad = [m for m in a.lora_target_modules or () if m not in allowed]
    _check(not bad, f"unknown lora_target_modules {bad}; choose from {allowed}")
    _check(not a.lora_paths or a.max_loaded_loras is None or len(a.lora_paths) <= a.max_loaded_loras,
           "more --lora-paths than max_loaded_loras")
    if a.enable_lora:
        _check(a.tp_size == 1 or a.nnodes == 1, "LoRA serving spans one node")
        _check(a.speculative_algorithm is None, "LoRA serving does not combine with speculative decoding yet")


def _check_deterministic(a: ServerArgs) -> None:
    if not a.enable_deterministic_inference:
        return
    _check(a.attention_backend == "auto", "--enable-deterministic-inference runs its own attention backend: leave "
                                          "--attention-backend auto")
    _check(a.tp_size == 1, "--enable-deterministic-inference needs --tp-size 1 (an all-reduce sums the ranks' "
                           "partials in an order that follows the message size)")
    _check(not a.enable_lora, "--enable-deterministic-inference takes no LoRA (the adapters' kernels group rows by "
                              "batch)")
    _check(a.quantization is None, "--enable-deterministic-inference takes float weights only (no --quantization)")


def validate(a: ServerArgs) -> None:
    _check_choices(a)
    _check_memory_and_scheduling(a)
    _check_speculative(a)
    _check_parallelism(a)
    _check_serving(a)
    _check_lora(a)
    _check_deterministic(a)
    _check_disaggregation(a)


def _check_disaggregation(a: ServerArgs) -> None:
    from radixlm.runtime.args.choices import TRANSFER_BACKENDS, DisaggregationMode

    _check(0 < a.disaggregation_bootstrap_port < 65536, "disaggregation_bootstrap_port must be in [1, 65535]")
    _check(a.disaggregation_transfer_backend in TRANSFER_BACKENDS,
           f"disaggregation_transfer_backend must be one of {', '.join(TRANSFER_BACKENDS)}")
    _check(math.isfinite(a.disaggregation_timeout) and a.disaggregation_timeout > 0,
           "disaggregation_timeout must be a finite number of seconds > 0")
    if a.disaggregation_mode is not DisaggregationMode.NULL:
        _check(a.disaggregation_bootstrap_port + a.tp_size - 1 < 65536,
               "disaggregation_bootstrap_port + tp_size - 1 must be a port (each rank listens on its own)")
        _check(a.dp_size == 1, "disaggregation_mode prefill/decode: one server per process (dp_size 1); put "
                               "several behind `radixlm router --pd-disaggregation`")
        _check(not a.is_embedding, "disaggregation_mode prefill/decode serves generation models only")
