"""ServerArgs: every knob of the runtime in one typed dataclass (the CLI is generated from it)."""
from __future__ import annotations

import dataclasses
import enum
import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


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


class GrammarMaskMode(str, enum.Enum):
    ON_DEMAND = "on_demand"  # a greedy row's mask is filled only when the grammar refuses the model's argmax
    ALWAYS = "always"


class SpeculativeAlgorithm(str, enum.Enum):
    NGRAM = "NGRAM"  # prompt lookup: the request's own earlier tokens continue its latest ones
    RADIX = "RADIX"  # what the radix cache holds after the request's tokens (scheduler/drafts/radix.py)
    NGRAM_RADIX = "NGRAM_RADIX"  # both: the cache's continuation of the whole sequence, prompt lookup, the cache's k-gram
    STANDALONE = "STANDALONE"  # a small draft model with the same tokenizer (scheduler/drafts/model.py)
    EAGLE = "EAGLE"  # an EAGLE head over the target's hidden states (executor/eagle_runner.py)
    EAGLE3 = "EAGLE3"  # the same: the head's config tells EAGLE-1 from EAGLE-3 (SGLang's name for the latter)

    @property
    def is_eagle(self) -> bool:
        return self in (SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.EAGLE3)


# Tokens drafted per step where neither --speculative-num-draft-tokens nor --speculative-num-steps says (radixlm's
# default so far): --speculative-num-draft-tokens DEFAULT_DRAFT_STEPS + 1, as SGLang counts it.
DEFAULT_DRAFT_STEPS = 4
# A pass's requests index a CUDA grid axis of the attention kernels, which holds at most 65535.
MAX_RUNNING_REQUESTS = 65535

# ServerArgs fields whose values are enums: a string given for them becomes the member.
ENUM_FIELDS = {"schedule_policy": SchedulePolicyName, "jump_forward": JumpForwardMode, "grammar_mask": GrammarMaskMode,
               "speculative_algorithm": SpeculativeAlgorithm}
SCHEDULE_POLICIES = tuple(m.value for m in SchedulePolicyName)
EVICTION_POLICIES = ("lru", "lfu", "fifo")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch_native", "triton")
GRAMMAR_BACKENDS = ("xgrammar",)
JUMP_FORWARD_MODES = tuple(m.value for m in JumpForwardMode)
GRAMMAR_MASK_MODES = tuple(m.value for m in GrammarMaskMode)
TOOL_CALL_PARSERS = ("auto", "qwen25", "hermes", "llama3")


def _is_host_port(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


@dataclass
class ServerArgs:
    # Model
    model_path: str = field(default="default", metadata={"help": "HF directory, GGUF file, 'default' (SmolLM2-135M-Instruct) or 'qwen2.5-0.5b'"})
    tokenizer_path: str | None = field(default=None, metadata={"help": "defaults to the model's own tokenizer"})
    load_format: str = field(default="auto", metadata={"choices": LOAD_FORMATS})
    dtype: str = field(default="auto", metadata={"choices": DTYPES, "help": "auto: float32 on CPU, the config's dtype on CUDA"})
    context_length: int | None = field(default=None, metadata={"help": "defaults to the model config's"})
    device: str = field(default="auto", metadata={"help": "auto: cuda when available, else cpu"})
    random_seed: int | None = None

    # Parallelism (SGLang's names): one scheduler process per tensor-parallel rank, ranks spread over --nnodes hosts
    tp_size: int = field(default=1, metadata={"help": "tensor-parallel ranks (one process and one GPU each; gloo on CPU)"})
    ep_size: int = field(default=1, metadata={"help": "expert-parallel ranks for MoE models: 1 (experts sliced over the TP ranks) or --tp-size (whole experts per rank)"})
    dp_size: int = field(default=1, metadata={"help": "data-parallel replicas behind a router (radixlm serve)"})
    nnodes: int = field(default=1, metadata={"help": "hosts the tensor-parallel ranks span"})
    node_rank: int = field(default=0, metadata={"help": "this host's index; the HTTP server runs on node 0"})
    dist_init_addr: str | None = field(default=None, metadata={"help": "host:port of node 0 where the ranks meet (required with --nnodes > 1)"})
    base_gpu_id: int = field(default=0, metadata={"help": "the first GPU this server's ranks use"})
    dist_timeout: float = field(default=300.0, metadata={"help": "seconds a collective may wait for the other ranks before the server fails"})
    disable_custom_all_reduce: bool = field(default=False, metadata={"help": "all-reduce through NCCL only (otherwise tensors up to 8 MiB go through symmetric memory over NVLink, where available)"})

    # Memory
    mem_fraction_static: float | None = field(default=None, metadata={"help": "share of device memory for weights + KV pool"})
    max_total_tokens: int | None = field(default=None, metadata={"help": "KV pool size in tokens (overrides the memory fraction)"})
    max_running_requests: int | None = None
    page_size: int = 1

    # Scheduling
    schedule_policy: SchedulePolicyName = field(default=SchedulePolicyName.LPM, metadata={"choices": SCHEDULE_POLICIES})
    schedule_conservativeness: float = 1.0
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = field(default=None, metadata={"help": "-1 disables chunking; default 8192 on CUDA, 2048 on CPU"})

    # Speculative decoding (drafts verified by the next pass: greedy outputs are unchanged)
    speculative_algorithm: SpeculativeAlgorithm | None = field(default=None, metadata={"choices": tuple(m.value for m in SpeculativeAlgorithm), "help": "NGRAM: draft from the request's own prompt and output (prompt lookup)"})
    speculative_num_draft_tokens: int | None = field(default=None, metadata={"help": "N, as SGLang counts it: the tokens one verify pass holds per request, counting the root (the newest accepted token), so at most N - 1 are drafted per step (>= 2). With --speculative-eagle-topk 1 (chains: STANDALONE, EAGLE) it is --speculative-num-steps + 1, as SGLang sets it (a warning when another value is given); with K > 1 the tree has N nodes, its root among them. Default: --speculative-num-steps + 1 for STANDALONE / EAGLE (SGLang's rule; with none of the three EAGLE values given, SGLang picks them per model, radixlm keeps 4 steps of topk 1, so 5), 5 for NGRAM / RADIX (radixlm's earlier default of 4 drafted tokens)"})
    speculative_num_steps: int | None = field(default=None, metadata={"help": "STANDALONE, EAGLE: draft model passes per request and step at most (a chain's tokens, a tree's depth); default --speculative-num-draft-tokens - 1 where that is given, else 4 (radixlm's default: 4 drafted tokens)"})
    speculative_draft_model_path: str | None = field(default=None, metadata={"help": "STANDALONE: the draft model (HF directory; the target's tokenizer); EAGLE: the head's directory (config.json, weights)"})
    speculative_eagle_topk: int = field(default=1, metadata={"help": "EAGLE: branches per draft step (1: chain drafts; K > 1: each step expands the K best children of the K best nodes, the --speculative-num-draft-tokens - 1 best nodes and the root are verified in one pass with a tree mask; not for requests with a grammar; torch_native and triton attention backends)"})
    speculative_ngram_min_match_window_size: int = field(default=2, metadata={"help": "NGRAM: shortest run of latest tokens looked up (default 2, SGLang's 1: a single token's match rarely holds; benchmarks/speculative.py's replays at batch 1 with 1: 8 drafts of story all rejected, 61 passes for edit's 96 tokens; with 2: 4 and 58)"})
    speculative_ngram_max_match_window_size: int = field(default=4, metadata={"help": "NGRAM: longest run of latest tokens looked up (longest match first)"})
    speculative_radix_match_window_size: int = field(default=4, metadata={"help": "RADIX: latest tokens looked up in the cache's k-gram index when the request's whole sequence is not cached"})
    speculative_max_batch_rows: int = field(default=64, metadata={"help": "rows a decode pass may reach with its drafts: each request drafts at most (rows - batch) // batch tokens, none once the batch exceeds rows / 2 (jump-forward excepted); 0: no limit"})
    speculative_measure_window: int = field(default=8, metadata={"help": "the scheduler measures output tokens per request and second of its steps with drafting on and off, per batch-size bucket (powers of two), in windows of this many decode steps, and turns drafting (NGRAM, RADIX, STANDALONE, EAGLE; not grammar jump-forward) off where off is faster by 2%, exploring the other regime now and then (drafts/controller.py); 0: no measuring, drafting wherever the batch rule allows"})

    # Radix cache
    disable_radix_cache: bool = False
    radix_eviction_policy: str = field(default="lru", metadata={"choices": EVICTION_POLICIES})

    # Kernels
    attention_backend: str = field(default="auto", metadata={"choices": ATTENTION_BACKENDS, "help": "auto: triton on CUDA, torch_native elsewhere"})
    disable_cuda_graph: bool = field(default=False, metadata={"help": "run decode eagerly instead of replaying CUDA graphs"})
    disable_tuned_gemm: bool = field(default=False, metadata={"help": "run every decode GEMM past the few-row kernels through torch's cuBLAS call instead of the tuned cuBLASLt configuration this GPU model's table names for its shape (kernels/gemm/tuned/; each is bit-identical to cuBLAS's, checked at start-up)"})
    cuda_graph_max_bs: int | None = field(default=None, metadata={"help": "largest decode batch replayed from a CUDA graph (default: min(16 x max_running_requests, 1024): a row per jump-forward draft token or per token of a small prefill, those passes up to 512 rows)"})
    disable_shared_prefix_decode: bool = field(default=False, metadata={"help": "eager decode passes (batches past the CUDA graphs, and those of 512+ rows whose groups spare 32k+ positions of reads) read each cached prefix of at least 256 tokens that several running requests matched once for all of them (cascade attention, triton backend) unless this is set (benchmarks/results/peer_side_by_side_spd.json: generated-shared-prefix 1.31x, the other workloads unchanged)"})
    disable_overlap_schedule: bool = field(default=False, metadata={"help": "process each batch's results before launching the next (overlap is the default on CUDA)"})
    disable_mixed_prefill: bool = field(default=False, metadata={"help": "run a small prefill (one CUDA-graph row per token) in a pass of its own instead of with the running requests' decode rows"})
    enable_mixed_chunk: bool = field(default=False, metadata={"help": "every prefill pass (a prompt's chunk, a pass too large for a CUDA graph) carries the running requests' decode rows, which then take that many tokens of the pass's chunk and prefill budgets (SGLang's --enable-mixed-chunk); without it only a small prefill does"})
    enable_overlap_schedule: bool = field(default=False, metadata={"help": "overlap on CPU too (for tests: same outputs, no speed-up)"})

    # Serving
    grammar_backend: str = field(default="xgrammar", metadata={"choices": GRAMMAR_BACKENDS, "help": "compiles regex / json_schema / ebnf constraints"})
    jump_forward: JumpForwardMode = field(default=JumpForwardMode.OFF, metadata={"choices": JUMP_FORWARD_MODES, "help": "fast: the paper's (may change tokenization); exact: verified, greedy output identical to off"})
    grammar_mask: GrammarMaskMode = field(default=GrammarMaskMode.ON_DEMAND, metadata={"choices": GRAMMAR_MASK_MODES, "help": "on_demand: a greedy request's grammar mask is filled only when the grammar refuses the model's own argmax (same tokens as always); always: at every step"})
    stream_interval: int = field(default=1, metadata={"help": "a streaming request reports every this many new tokens (its sampling_params.stream_interval overrides)"})
    incremental_streaming_output: bool = field(default=False, metadata={"help": "streamed /generate chunks carry only what is new (default: cumulative, as SGLang)"})
    tool_call_parser: str = field(default="auto", metadata={"choices": TOOL_CALL_PARSERS, "help": "format of tool calls in the model's text; auto: from the chat template"})
    api_key: str | None = field(default=None, metadata={"help": "require 'Authorization: Bearer KEY' (except /health*, /metrics)"})
    max_queued_requests: int | None = field(default=None, metadata={"help": "reject (503) generation requests beyond max_running_requests + this"})
    max_logprobs: int = field(default=20, metadata={"help": "the most top logprobs a request may ask for per position (top_logprobs_num, logprobs, top_logprobs); -1: the vocabulary size"})
    watchdog_timeout: float = field(default=300.0, metadata={"help": "seconds without scheduler progress (requests pending) before failing them"})

    # Multimodal models (LLaVA): media inputs
    mm_encoder_cache_mb: int = field(default=1024, metadata={"help": "encoder outputs kept by content hash (MiB), so a chunked prefill encodes an image once"})
    allowed_local_media_path: str | None = field(default=None, metadata={"help": "media may be read from files under this directory (file paths and file:// URLs); refused without it"})
    allowed_media_domains: list[str] | None = field(default=None, metadata={"help": "http(s) media URLs only from these hosts (and their subdomains); default: any host"})
    media_fetch_timeout: float = field(default=10.0, metadata={"help": "seconds to fetch one http(s) media URL"})
    max_media_bytes: int = field(default=20 << 20, metadata={"help": "largest media item accepted (bytes, after base64 decoding)"})

    # Debugging
    enable_integrity_check: bool = field(default=False, metadata={"help": "check KV accounting after every scheduler step"})
    log_level: str = "info"

    def __post_init__(self) -> None:
        for name, kind in ENUM_FIELDS.items():
            value = getattr(self, name)
            if not isinstance(value, kind) and value in {m.value for m in kind}:
                setattr(self, name, kind(value))
        self.validate()

    def _resolve_draft_tokens(self, model: bool) -> None:
        """SGLang's --speculative-num-draft-tokens: the verify pass's tokens per request, the root (the newest accepted
        token) counted, so a step drafts at most N - 1. A draft model's chain (topk 1) has N = steps + 1, as SGLang
        forces it; unset, N is steps + 1 (steps: N - 1 where N is given, else DEFAULT_DRAFT_STEPS)."""
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

    def validate(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        check(isinstance(self.schedule_policy, SchedulePolicyName), f"unknown schedule_policy {self.schedule_policy!r}; choose from {SCHEDULE_POLICIES}")
        check(self.radix_eviction_policy in EVICTION_POLICIES, f"unknown radix_eviction_policy {self.radix_eviction_policy!r}; choose from {EVICTION_POLICIES}")
        check(self.load_format in LOAD_FORMATS, f"unknown load_format {self.load_format!r}; choose from {LOAD_FORMATS}")
        check(self.dtype in DTYPES, f"unknown dtype {self.dtype!r}; choose from {DTYPES}")
        check(self.attention_backend in ATTENTION_BACKENDS, f"unknown attention_backend {self.attention_backend!r}; choose from {ATTENTION_BACKENDS}")
        check(self.page_size >= 1, "page_size must be >= 1")
        check(self.max_prefill_tokens >= 1, "max_prefill_tokens must be >= 1")
        check(self.max_total_tokens is None or self.max_total_tokens >= 1, "max_total_tokens must be >= 1")
        check(self.max_running_requests is None or 1 <= self.max_running_requests <= MAX_RUNNING_REQUESTS,
              f"max_running_requests must be in [1, {MAX_RUNNING_REQUESTS}]")
        check(self.mem_fraction_static is None or 0 < self.mem_fraction_static < 1, "mem_fraction_static must be in (0, 1)")
        check(self.chunked_prefill_size is None or self.chunked_prefill_size == -1 or self.chunked_prefill_size >= self.page_size,
              "chunked_prefill_size must be -1 (off) or >= page_size")
        check(self.max_queued_requests is None or self.max_queued_requests >= 0, "max_queued_requests must be >= 0")
        check(self.grammar_backend in GRAMMAR_BACKENDS, f"unknown grammar_backend {self.grammar_backend!r}; choose from {GRAMMAR_BACKENDS}")
        check(isinstance(self.grammar_mask, GrammarMaskMode), f"unknown grammar_mask {self.grammar_mask!r}; choose from {GRAMMAR_MASK_MODES}")
        check(isinstance(self.jump_forward, JumpForwardMode), f"unknown jump_forward {self.jump_forward!r}; choose from {JUMP_FORWARD_MODES}")
        check(self.tool_call_parser in TOOL_CALL_PARSERS, f"unknown tool_call_parser {self.tool_call_parser!r}; choose from {TOOL_CALL_PARSERS}")
        check(self.stream_interval >= 1, "stream_interval must be >= 1")
        check(self.speculative_algorithm is None or isinstance(self.speculative_algorithm, SpeculativeAlgorithm),
              f"unknown speculative_algorithm {self.speculative_algorithm!r}; choose from "
              f"{tuple(m.value for m in SpeculativeAlgorithm)}")
        check(1 <= self.speculative_ngram_min_match_window_size <= self.speculative_ngram_max_match_window_size,
              "need 1 <= speculative_ngram_min_match_window_size <= speculative_ngram_max_match_window_size")
        check(self.speculative_radix_match_window_size >= 1, "speculative_radix_match_window_size must be >= 1")
        check(self.speculative_max_batch_rows >= 0, "speculative_max_batch_rows must be >= 0 (0: no limit)")
        check(self.speculative_measure_window >= 0, "speculative_measure_window must be >= 0 (0: no measuring)")
        check(self.speculative_num_steps is None or self.speculative_num_steps >= 1, "speculative_num_steps must be >= 1")
        algo = self.speculative_algorithm
        model = algo is SpeculativeAlgorithm.STANDALONE or (algo is not None and algo.is_eagle)
        check(not model or self.speculative_draft_model_path is not None,
              f"--speculative-algorithm {getattr(self.speculative_algorithm, 'value', '')} needs "
              "--speculative-draft-model-path")
        check(not model or self.tp_size == 1, "a draft model (STANDALONE, EAGLE) runs with tp_size 1 only")
        check(self.speculative_eagle_topk >= 1, "speculative_eagle_topk must be >= 1")
        check(self.speculative_eagle_topk == 1 or (algo is not None and algo.is_eagle),
              "speculative_eagle_topk > 1 (tree drafts) needs --speculative-algorithm EAGLE or EAGLE3")
        if algo is not None:
            self._resolve_draft_tokens(model)
        check(self.watchdog_timeout > 0, "watchdog_timeout must be > 0")
        check(self.tp_size >= 1, "tp_size must be >= 1")
        check(self.ep_size in (1, self.tp_size), f"ep_size must be 1 or equal to tp_size ({self.tp_size})")
        check(self.dp_size >= 1, "dp_size must be >= 1")
        check(self.nnodes >= 1 and self.tp_size % self.nnodes == 0, "tp_size must be a multiple of nnodes")
        check(0 <= self.node_rank < self.nnodes, "node_rank must be in [0, nnodes)")
        check(self.nnodes == 1 or self.dist_init_addr is not None, "--nnodes > 1 needs --dist-init-addr host:port")
        check(self.dist_init_addr is None or _is_host_port(self.dist_init_addr), "dist_init_addr must be host:port")
        check(self.base_gpu_id >= 0, "base_gpu_id must be >= 0")
        check(self.dist_timeout > 0, "dist_timeout must be > 0")
        check(self.max_logprobs >= -1, "max_logprobs must be -1 (the vocabulary size) or >= 0")
        check(self.schedule_conservativeness > 0, "schedule_conservativeness must be > 0")
        check(self.mm_encoder_cache_mb >= 0, "mm_encoder_cache_mb must be >= 0")
        check(self.media_fetch_timeout > 0, "media_fetch_timeout must be > 0")
        check(self.max_media_bytes >= 1, "max_media_bytes must be >= 1")
        check(self.cuda_graph_max_bs is None or self.cuda_graph_max_bs >= 1, "cuda_graph_max_bs must be >= 1")

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @classmethod
    def from_kwargs(cls, **kwargs) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"unknown server argument(s): {', '.join(unknown)}")
        return cls(**kwargs)
