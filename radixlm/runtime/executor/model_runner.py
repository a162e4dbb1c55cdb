"""ModelRunner: owns the model, the KV pools and the attention backend; runs one forward pass."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.cache.kv_quant import KVScales, kv_cache_torch_dtype
from radixlm.runtime.cache.kv_pool import KVLayout, KVPool
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator, make_kv_pool
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode, ModelWorkerBatch, TreeMask
from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.executor.memory import MemoryReserve, kv_pool_tokens
from radixlm.runtime.executor.logits import LogitsOutput, LogitsPlan, LogitsProcessor, split_rows
from radixlm.runtime.executor.pooler import Pooler, PoolingConfig
from radixlm.runtime.kernels import gemm
from radixlm.runtime.kernels.startup import EXTEND_WARMUP_LENS, prepare_gemms, warm_up_kernels
from radixlm.runtime.layers.attention.deterministic import DeterministicAttnBackend
from radixlm.runtime.layers.attention.torch_native import TorchNativeAttnBackend
from radixlm.runtime.layers.attention.triton_backend import TritonAttnBackend
from radixlm.runtime.layers.linear import Shard
from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.layers.radix_attention import RadixAttention
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import load_model
from radixlm.runtime.multimodal.embedder import EncoderCache, MultimodalEmbedder

logger = logging.getLogger(__name__)

# Eager decode passes of 512-1024 rows (the first ~120 steps of ShareGPT-like, 1000 requests at once) cost the host
# about as long as the device takes: replayed, the host keeps ahead.
CUDA_GRAPH_DEFAULT_MAX_BS = 1024
# Passes with several rows for some request (a prompt's, drafts) replay up to this many rows: each row reads its
# whole context through the decode kernel, which past this costs more than the extend kernels' one walk.
MULTI_ROW_REPLAY_MAX_ROWS = 512
# Graphs hold this many rows per running request: a pass can carry a row per draft token, and a small prefill runs as
# TOKEN_ROWS with a row per token.
DECODE_ROWS_PER_REQ = 16
ATTENTION_BACKENDS = {"torch_native": TorchNativeAttnBackend, "triton": TritonAttnBackend}


@dataclass(frozen=True)
class SharedSlots:
    """A runner over another runner's slots (a draft model's, an EAGLE head's): the other's request table, allocator
    and pool size, with a KV pool of its own of that size plus `extra_slots`. Its owner builds its kernels and graphs:
    it has no tuned GEMMs, media, warm-up or graphs of its own."""

    target: "ModelRunner"
    extra_slots: int = 0
    model: torch.nn.Module | None = None  # built by the owner; None: loaded from the runner's model_config
    logits_processor: LogitsProcessor | None = None  # None: over the model's lm_head


class ModelRunner:
    def __init__(self, server_args: ServerArgs, model_config: ModelConfig, device: str, parallel: Parallel = SINGLE,
                 shared: SharedSlots | None = None, reserve: MemoryReserve = MemoryReserve()):
        self.server_args = server_args
        self.model_config = model_config
        self.device = device
        self.parallel = parallel
        self.page_size = server_args.page_size
        own = shared is None or shared.model is None
        self.model = load_model(model_config, server_args.load_format, device, parallel) if own else shared.model
        # This rank's KV heads (all of them without tensor parallelism).
        self.num_kv_heads = Shard.heads(model_config.num_kv_heads, 1, parallel, "num_key_value_heads").local
        self.model.eval()
        self.lora = self._lora_manager() if own and shared is None and server_args.enable_lora else None
        self.logits_processor = (LogitsProcessor(self.model.lm_head, model_config.vocab_size, parallel)
                                 if shared is None or shared.logits_processor is None else shared.logits_processor)
        self.deterministic = server_args.enable_deterministic_inference
        prepare_gemms(self, tuned=shared is None and not server_args.disable_tuned_gemm and not self.deterministic,
                      share=shared is None)
        if self.deterministic:
            self._make_batch_invariant()
        self.pooler = self._pooler() if server_args.is_embedding and shared is None else None
        if shared is not None:
            self._share_slots(shared)
            return
        self.mm_embedder = (MultimodalEmbedder(self.model, EncoderCache(server_args.mm_encoder_cache_mb << 20))
                            if hasattr(self.model, "encode_items") else None)

        # The request table comes first so that the KV pool's budget sees its memory.
        max_running = server_args.max_running_requests or (4096 if self.is_cuda else 256)
        self.req_to_token_pool = ReqToTokenPool(max_running + 1, model_config.context_len + 4, device)
        self.max_total_num_tokens = kv_pool_tokens(server_args, self.is_cuda, parallel, self.kv_bytes_per_token(),
                                                   self.req_to_token_pool.size, reserve)
        self.max_running_requests = server_args.max_running_requests or max(
            1, min(self.max_total_num_tokens // 2, max_running))
        self.token_to_kv_pool = self._kv_pool(self.max_total_num_tokens)
        # On CUDA the allocator's double-free check would read device memory back on every free (a sync).
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
            self.max_total_num_tokens, self.page_size, device,
            debug=not self.is_cuda or server_args.enable_integrity_check)
        self.attn_backend = self._attention_backend()
        logger.info("KV pool: %d tokens (%.1f MiB, %s), max running requests %d", self.max_total_num_tokens,
                    self.token_to_kv_pool.mem_bytes() / 2**20, str(self.token_to_kv_pool.dtype).removeprefix("torch."),
                    self.max_running_requests)
        self.graph_runner: CudaGraphRunner | None = None
        graph_max_bs = self.graph_max_bs()
        if self.is_cuda:
            warm_up_kernels(self, graph_max_bs)
        if graph_max_bs:
            self.graph_runner = CudaGraphRunner(self, graph_max_bs)
        if self.is_cuda:
            free, total = torch.cuda.mem_get_info()
            logger.info("GPU memory after start-up: %.2f GiB in use of %.2f GiB (%.2f GiB free)",
                        (total - free) / 2**30, total / 2**30, free / 2**30)

    def _lora_manager(self):
        from radixlm.runtime.lora.manager import LoraManager, LoraOptions
        from radixlm.runtime.lora.registry import startup_refs

        manager = LoraManager(self.model, LoraOptions.from_args(self.server_args), self.model_config.num_layers,
                              self.model_config.dtype, self.device, self.parallel.tp_rank)
        for ref in startup_refs(self.server_args.lora_paths):
            manager.load_adapter(ref.lora_id, ref.lora_name, ref.lora_path)
        return manager

    @property
    def is_causal(self) -> bool:
        """Whether a row attends only to those before it (a decoder): only then can a cached prefix stand in for a
        prompt's first rows."""
        return getattr(self.model, "is_causal", True)

    def _make_batch_invariant(self) -> None:
        """--enable-deterministic-inference: every GEMM through the batch-invariant one; refused for layers that have
        no batch-invariant form here (quantized GEMMs, MoE routing and grouping) and for bidirectional attention."""
        if not self.is_causal:
            raise ValueError("--enable-deterministic-inference needs a causal (decoder) model")
        unsupported = sorted({type(m).__name__ for m in self.model.modules()
                              if getattr(m, "quant_method", None) is not None or isinstance(m, FusedMoE)})
        if unsupported:
            raise ValueError(f"--enable-deterministic-inference has no batch-invariant form of this model's "
                             f"{', '.join(unsupported)} layers (quantized or MoE)")
        for _, holder in self.gemm_holders():
            holder.gemm_choices = gemm.BatchInvariantMemo()

    def _pooler(self) -> Pooler:
        classify = getattr(self.model, "classify", None)
        config = PoolingConfig.from_model_dir(self.model_config.model_path, self.is_causal)
        dim = self.model_config.hf_config.num_labels if classify is not None else self.model_config.hidden_size
        return Pooler(config, dim, classify)

    def _share_slots(self, shared: SharedSlots) -> None:
        target, cfg = shared.target, self.model_config
        self.mm_embedder = None
        self.req_to_token_pool = target.req_to_token_pool
        self.token_to_kv_pool_allocator = target.token_to_kv_pool_allocator
        self.max_total_num_tokens = target.max_total_num_tokens
        self.max_running_requests = target.max_running_requests
        self.token_to_kv_pool = self._kv_pool(self.max_total_num_tokens + shared.extra_slots)
        self.attn_backend = self._attention_backend()
        self.graph_runner: CudaGraphRunner | None = None

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        return kv_cache_torch_dtype(self.server_args.kv_cache_dtype, self.model_config.dtype)

    @property
    def kv_layout(self) -> KVLayout:
        """What the pool stores per token per layer: the model's K and V heads of this rank, or MLA's latent."""
        cfg = self.model_config
        if cfg.mla is not None:
            return KVLayout.mla(cfg.num_layers, self.kv_cache_dtype, cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim)
        return KVLayout.mha(cfg.num_layers, self.kv_cache_dtype, self.num_kv_heads, cfg.head_dim)

    def _kv_pool(self, size: int) -> KVPool:
        """The KV pool in --kv-cache-dtype, with each layer's scales (its RadixAttention's: the checkpoint's)."""
        cfg = self.model_config
        # Triton converts float8 e4m3 (its fp8e4nv) on compute capability 8.9 and later only.
        if (self.is_cuda and self.kv_cache_dtype is torch.float8_e4m3fn
                and torch.cuda.get_device_capability(self.device) < (8, 9)):
            raise ValueError(f"--kv-cache-dtype fp8_e4m3 needs a GPU of compute capability 8.9 or later (this one: "
                             f"{torch.cuda.get_device_capability(self.device)}); use fp8_e5m2 or auto")
        by_layer = {m.layer_id: KVScales(m.k_scale, m.v_scale) for m in self.model.modules()
                    if isinstance(m, RadixAttention)}
        scales = [by_layer.get(i, KVScales()) for i in range(cfg.num_layers)]
        return make_kv_pool(self.kv_layout, size, self.page_size, self.device, scales)

    def _attention_backend(self):
        if self.server_args.enable_deterministic_inference:
            return DeterministicAttnBackend(self)
        backend = self.server_args.attention_backend
        if backend == "auto":
            backend = "triton" if self.is_cuda else "torch_native"
        return ATTENTION_BACKENDS[backend](self)

    @property
    def is_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def release_cuda_graphs(self) -> None:
        """Frees the captured decode graphs. Before a rank leaves its process group: a graph that captured NCCL
        kernels keeps the communicator in use, and destroying it then waits forever (pytorch/pytorch#115388)."""
        if self.graph_runner is not None:
            for graph in self.graph_runner.graphs.values():
                graph.reset()
            self.graph_runner = None

    def refresh_weights(self) -> None:
        """After the weights changed in place: rebuilds the copies derived from them (the oneDNN-packed CPU weights)."""
        if self.is_cuda:
            return
        for module in self.model.modules():
            if hasattr(module, "pack_for_cpu"):
                module.pack_for_cpu()
        self.logits_processor.pack_for_cpu()

    def drop_packed_weights(self) -> None:
        for holder in [*self.model.modules(), self.logits_processor]:
            if getattr(holder, "packed_weight", None) is not None:
                holder.packed_weight = None

    def capture_cuda_graphs(self) -> None:
        """Captures the decode graphs again (after a memory resume: the weights and KV pool have new addresses)."""
        self.release_cuda_graphs()
        graph_max_bs = self.graph_max_bs()
        if graph_max_bs:
            self.graph_runner = CudaGraphRunner(self, graph_max_bs)

    def kv_bytes_per_token(self) -> int:
        return self.kv_layout.bytes_per_token

    def graph_max_bs(self) -> int:
        """The largest batch a CUDA graph is captured for (0: no graphs)."""
        args = self.server_args
        # Eager passes for embeddings (prefills, and the graphs yield logits), under --lora-backend torch_native
        # (its graph-safe form gathers every row's A and B: a CPU stand-in), and for a model whose attention reads
        # host data per pass (MLA's torch path).
        lora_eager = self.lora is not None and not self.lora.context.use_triton
        if (not (self.is_cuda and not args.disable_cuda_graph and self.attn_backend.supports_cuda_graph)
                or lora_eager or self.pooler is not None or not getattr(self.model, "supports_cuda_graph", True)):
            return 0
        return min(args.cuda_graph_max_bs or CUDA_GRAPH_DEFAULT_MAX_BS, self.max_pass_rows)

    @property
    def max_pass_rows(self) -> int:
        """The most rows a decode pass can have."""
        return self.max_running_requests * DECODE_ROWS_PER_REQ

    @property
    def takes_shared_prefixes(self) -> bool:
        """Whether eager decode passes read ModelWorkerBatch.shared_prefixes (the planner forms groups only then)."""
        return (not self.server_args.disable_shared_prefix_decode and self.attn_backend.supports_shared_prefix
                and getattr(self.model, "supports_shared_prefix", True))

    def gemm_holders(self) -> list[tuple[str, gemm.GemmHolder]]:
        """(name, holder) of every few-row GEMM choice memo (gemm.linear's): the model's layers, then the lm_head."""
        layers = [(n, m) for n, m in self.model.named_modules() if hasattr(m, "gemm_choices")]
        return layers + [("lm_head", self.logits_processor)]

    def gemm_choice_counts(self) -> dict[str, dict[int, dict[str, int]]]:
        return gemm.gemm_choice_counts(self.gemm_holders())

    def warm_up_token_rows(self, bs: int, seq_len: int) -> LogitsOutput:
        """An eager TOKEN_ROWS pass of bs requests, each at position seq_len - 1 of request row 0 (KV slot 0)."""
        z = torch.zeros(bs, dtype=torch.int64, device=self.device)
        fb = ForwardBatch(
            forward_mode=ForwardMode.TOKEN_ROWS, batch_size=bs, input_ids=z, positions=z + (seq_len - 1),
            req_pool_indices=z, seq_lens=z + seq_len, seq_lens_cpu=[seq_len] * bs, out_cache_loc=z,
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.attn_backend)
        if self.lora is not None:
            fb.lora = self.lora.warmup_info([1] * bs, gather=True)  # the graphs' kernels (eager ones: extend's)
        return self._run(fb, LogitsPlan(sample_rows=list(range(bs))))

    @torch.inference_mode()
    def warm_up_extend(self, tree_masks: bool = False) -> None:
        """Builds the kernels of eager (extend) passes: extend attention's two tile shapes (at most and over 16 new
        tokens per request), and with tree_masks the same with tree drafts' masks (USE_CUSTOM_MASK). Dummy passes:
        request row 0 and KV slot 0, as padded CUDA-graph rows use them, before anything real is in the pool."""
        for masked in (False, True) if tree_masks else (False,):
            for extend_lens in EXTEND_WARMUP_LENS:
                fb = self.warmup_extend_batch(extend_lens, masked)
                if self.lora is not None:
                    fb.lora = self.lora.warmup_info(list(extend_lens))
                self._run(fb, LogitsPlan(sample_rows=[fb.num_tokens - 1]))
        if self.is_cuda:
            torch.cuda.synchronize()

    def warmup_extend_batch(self, extend_lens, tree_masks: bool = False) -> ForwardBatch:
        """A dummy REQUEST_SPANS pass of len(extend_lens) requests with no prefix, all on request row 0 and KV slot
        0; with tree_masks each request carries a (causal) TreeMask, as tree drafts' passes do."""
        n, bs = sum(extend_lens), len(extend_lens)
        zeros = torch.zeros(n, dtype=torch.int64, device=self.device)
        starts = [sum(extend_lens[:i]) for i in range(bs)]
        return ForwardBatch(
            forward_mode=ForwardMode.REQUEST_SPANS, batch_size=bs, input_ids=zeros,
            positions=torch.cat([torch.arange(e, device=self.device) for e in extend_lens]),
            req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=self.device),
            seq_lens=torch.tensor(extend_lens, device=self.device), seq_lens_cpu=list(extend_lens),
            out_cache_loc=zeros, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.attn_backend, extend_prefix_lens_cpu=[0] * bs, extend_seq_lens_cpu=list(extend_lens),
            extend_start_loc=torch.tensor(starts, device=self.device),
            tree_masks=[TreeMask(0, torch.ones(e, e, dtype=torch.bool).tril()) for e in extend_lens] if tree_masks
            else None)

    def can_replay(self, num_rows: int, input_logprobs: bool = False, multi_row: bool = False) -> bool:
        """Whether a pass of `num_rows` rows runs as one CUDA-graph replay (prompt logprobs need an eager pass).
        multi_row: some request has several rows (MULTI_ROW_REPLAY_MAX_ROWS)."""
        if self.graph_runner is None or input_logprobs:
            return False
        return 0 < num_rows <= (min(self.graph_runner.max_bs, MULTI_ROW_REPLAY_MAX_ROWS) if multi_row
                                else self.graph_runner.max_bs)

    def choose_mode(self, wb: ModelWorkerBatch) -> ForwardMode:
        """TOKEN_ROWS when the pass replays a graph, or when each request has one row (a decode pass: the decode
        kernels); otherwise REQUEST_SPANS (the extend kernels, one call for a request's rows)."""
        if wb.tree_masks is not None:
            return ForwardMode.REQUEST_SPANS  # tree drafts' masks: the extend path
        input_logprobs = bool(wb.logits.input_rows)
        one_each = wb.num_rows == len(wb.req_pool_indices) and not input_logprobs
        if one_each or self.can_replay(wb.num_rows, input_logprobs, multi_row=True):
            return ForwardMode.TOKEN_ROWS
        return ForwardMode.REQUEST_SPANS

    @torch.inference_mode()
    def forward(self, wb: ModelWorkerBatch) -> LogitsOutput:
        """Logits for the plan's rows of a pass (enqueued: nothing here waits for the device)."""
        fb = ForwardBatch.build(wb, self.choose_mode(wb), self.req_to_token_pool, self.token_to_kv_pool,
                                self.attn_backend, self.device)
        if self.lora is not None:
            fb.lora = self.lora.prepare(wb.lora, wb.extend_lens)
        out = self._run(fb, wb.logits)
        out.req_pool_indices = fb.req_pool_indices
        return out

    def _run(self, forward_batch: ForwardBatch, plan: LogitsPlan) -> LogitsOutput:
        if forward_batch.mm_spans:
            forward_batch.input_embeds = self.mm_embedder.embed(forward_batch.input_ids, forward_batch.mm_spans)
        # Media rows and multimodal positions run eagerly: the graphs embed token ids and take a position per row.
        plain = not forward_batch.mm_spans and forward_batch.mrope_positions is None
        if plain and self.graph_runner is not None and self.graph_runner.can_run(forward_batch):
            logits = self.graph_runner.replay(forward_batch)
            if not plan.verify_rows and len(plan.sample_rows) == forward_batch.batch_size:
                # The usual decode batch: sample rows are ascending and distinct, so this is every row in order.
                return LogitsOutput(logits, [], [], forward_mode=ForwardMode.TOKEN_ROWS)
            # Several rows for some request (drafts, a small prefill): pick the plan's rows.
            picked = logits[host_to_device(plan.sample_rows + plan.verify_rows, torch.long, logits.device)]
            return split_rows(picked, plan, [], [], ForwardMode.TOKEN_ROWS)
        if self.lora is not None:
            self.lora.context.info = forward_batch.lora  # what every adapted layer of this pass reads
        self.attn_backend.init_forward_metadata(forward_batch)
        hidden = self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)
        self.last_hidden = hidden  # every row's final hidden state (an EAGLE head reads them)
        if self.pooler is not None:
            return LogitsOutput(hidden.new_empty(len(plan.sample_rows), 0), [], [],
                                forward_mode=forward_batch.forward_mode, pooled=self.pooler(hidden, plan.pool_spans))
        return self.logits_processor(hidden, plan, forward_batch.forward_mode)
