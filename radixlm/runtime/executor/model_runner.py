"""ModelRunner: owns the model, the KV pools and the attention backend; runs one forward pass. What it builds at
start-up lives beside it: its KV slots (kv_slots.py), the flag-driven parts around the model (model_setup.py), its
graphs' sizes (graph_sizes.py) and the warm-up's dummy passes (warmup_passes.py)."""
from __future__ import annotations

import logging

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.cache.kv_quant import kv_cache_torch_dtype
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode, ModelWorkerBatch
from radixlm.runtime.executor.graph_sizes import (  # noqa: F401 - CUDA_GRAPH_DEFAULT_MAX_BS: imported from here
    CUDA_GRAPH_DEFAULT_MAX_BS, MULTI_ROW_REPLAY_MAX_ROWS, GraphSizes,
)
from radixlm.runtime.executor.kv_slots import KVSlots, SharedSlots, kv_layout
from radixlm.runtime.executor.model_setup import (
    attention_backend, is_causal, lora_manager, make_batch_invariant, pooler_for,
)
from radixlm.runtime.executor.warmup_passes import extend_batch, token_rows_batch
from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.executor.memory import MemoryReserve
from radixlm.runtime.executor.logits import LogitsOutput, LogitsPlan, LogitsProcessor, split_rows
from radixlm.runtime.kernels import gemm
from radixlm.runtime.kernels.startup import EXTEND_WARMUP_LENS, prepare_gemms, warm_up_kernels
from radixlm.runtime.layers.linear import Shard
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import load_model
from radixlm.runtime.multimodal.embedder import EncoderCache, MultimodalEmbedder

__all__ = ["CUDA_GRAPH_DEFAULT_MAX_BS", "MULTI_ROW_REPLAY_MAX_ROWS", "ModelRunner", "SharedSlots"]

logger = logging.getLogger(__name__)


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
        self.kv_cache_dtype = kv_cache_torch_dtype(server_args.kv_cache_dtype, model_config.dtype)
        self.kv_layout = kv_layout(model_config, self.kv_cache_dtype, self.num_kv_heads)
        self.model.eval()
        self.lora = (lora_manager(self.model, server_args, model_config, device, parallel)
                     if own and shared is None and server_args.enable_lora else None)
        self.logits_processor = (LogitsProcessor(self.model.lm_head, model_config.vocab_size, parallel)
                                 if shared is None or shared.logits_processor is None else shared.logits_processor)
        self.deterministic = server_args.enable_deterministic_inference
        prepare_gemms(self, tuned=shared is None and not server_args.disable_tuned_gemm and not self.deterministic,
                      share=shared is None)
        if self.deterministic:
            make_batch_invariant(self.model, self.gemm_holders())
        self.pooler = pooler_for(self.model, model_config) if server_args.is_embedding and shared is None else None
        self.mm_embedder = (MultimodalEmbedder(self.model, EncoderCache(server_args.mm_encoder_cache_mb << 20))
                            if shared is None and hasattr(self.model, "encode_items") else None)
        slots = (KVSlots.shared(shared, self.kv_layout, self.model, self.page_size, device) if shared is not None
                 else KVSlots.own(server_args, self.kv_layout, self.model, model_config.context_len, device, parallel,
                                  reserve))
        self.req_to_token_pool, self.token_to_kv_pool = slots.req_to_token_pool, slots.token_to_kv_pool
        self.token_to_kv_pool_allocator = slots.allocator
        self.max_total_num_tokens, self.max_running_requests = slots.max_total_num_tokens, slots.max_running_requests
        self.attn_backend = attention_backend(self, server_args, self.is_cuda)
        self.graph_sizes = GraphSizes.of(server_args, device, self.attn_backend, self.model, self.lora, self.pooler,
                                         self.max_running_requests)
        self.graph_runner: CudaGraphRunner | None = None
        if shared is not None:
            return  # its owner builds its kernels and graphs
        if self.is_cuda:
            warm_up_kernels(self, self.graph_sizes.max_bs)
        self.capture_cuda_graphs()
        if self.is_cuda:
            free, total = torch.cuda.mem_get_info()
            logger.info("GPU memory after start-up: %.2f GiB in use of %.2f GiB (%.2f GiB free)",
                        (total - free) / 2**30, total / 2**30, free / 2**30)

    @property
    def is_causal(self) -> bool:
        """Whether a row attends only to those before it (a decoder): only then can a cached prefix stand in for a
        prompt's first rows."""
        return is_causal(self.model)

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
        """After the weights changed in place (unpacked first: unpack_weights): packs what is unpacked (CPU)."""
        if self.is_cuda:
            return
        for module in self.model.modules():
            if hasattr(module, "pack_for_cpu"):
                module.pack_for_cpu()
        self.logits_processor.pack_for_cpu()

    def unpack_weights(self) -> None:
        """Before the weights are written or moved: the plain weights back in place of the packed ones (CPU), until
        refresh_weights."""
        for module in self.model.modules():
            if hasattr(module, "unpack_for_cpu"):
                module.unpack_for_cpu()
        self.logits_processor.packed_weight = None

    def capture_cuda_graphs(self) -> None:
        """Captures the decode graphs (again after a memory resume: the weights and KV pool have new addresses)."""
        self.release_cuda_graphs()
        if self.graph_sizes.max_bs:
            self.graph_runner = CudaGraphRunner(self, self.graph_sizes.max_bs)

    def kv_bytes_per_token(self) -> int:
        return self.kv_layout.bytes_per_token

    def graph_max_bs(self) -> int:
        """The largest batch a CUDA graph is captured for (0: no graphs)."""
        return self.graph_sizes.max_bs

    @property
    def max_pass_rows(self) -> int:
        """The most rows a decode pass can have."""
        return self.graph_sizes.max_pass_rows

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
        plan = LogitsPlan(sample_rows=list(range(bs)))
        if self.lora is not None:
            # A pass without adapter rows runs as the base model's (fused GEMMs): its kernels too.
            self._run(token_rows_batch(self, bs, seq_len), plan)
        fb = token_rows_batch(self, bs, seq_len)
        if self.lora is not None:
            fb.lora = self.lora.warmup_info([1] * bs, gather=True)  # the graphs' kernels (eager ones: extend's)
        return self._run(fb, plan)

    @torch.inference_mode()
    def warm_up_extend(self, tree_masks: bool = False) -> None:
        """Builds the kernels of eager (extend) passes: extend attention's two tile shapes (at most and over 16 new
        tokens per request), and with tree_masks the same with tree drafts' masks (USE_CUSTOM_MASK)."""
        for masked in (False, True) if tree_masks else (False,):
            for extend_lens in EXTEND_WARMUP_LENS:
                for lora in (False, True) if self.lora is not None else (False,):
                    fb = self.warmup_extend_batch(extend_lens, masked)
                    if lora:
                        fb.lora = self.lora.warmup_info(list(extend_lens))
                    self._run(fb, LogitsPlan(sample_rows=[fb.num_tokens - 1]))
        if self.is_cuda:
            torch.cuda.synchronize()

    def warmup_extend_batch(self, extend_lens, tree_masks: bool = False) -> ForwardBatch:
        """A dummy REQUEST_SPANS pass over this runner's pools (warmup_passes.extend_batch)."""
        return extend_batch(self, extend_lens, tree_masks)

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
            # A replay reads only the rows' slots on the host (the graph's table is refilled from them).
            fb.lora = self.lora.prepare(wb.lora, wb.extend_lens, host_only=self._replays(fb))
        out = self._run(fb, wb.logits)
        out.req_pool_indices = fb.req_pool_indices
        return out

    def _replays(self, fb: ForwardBatch) -> bool:
        """Whether the pass runs as a CUDA-graph replay. Media rows and multimodal positions run eagerly: the graphs
        embed token ids and take a position per row."""
        plain = not fb.mm_spans and fb.mrope_positions is None
        return plain and self.graph_runner is not None and self.graph_runner.can_run(fb)

    def _run(self, forward_batch: ForwardBatch, plan: LogitsPlan) -> LogitsOutput:
        if forward_batch.mm_spans:
            forward_batch.input_embeds = self.mm_embedder.embed(forward_batch.input_ids, forward_batch.mm_spans)
        loads = forward_batch.layer_loads
        if self._replays(forward_batch):
            if loads is not None:  # a graph cannot wait per layer on events recorded outside it
                loads.wait_all()
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
        if loads is not None:  # what runs after the pass comes after the loads, whichever layers waited
            loads.wait_all()
        self.last_hidden = hidden  # every row's final hidden state (an EAGLE head reads them)
        if self.pooler is not None:
            return LogitsOutput(hidden.new_empty(len(plan.sample_rows), 0), [], [],
                                forward_mode=forward_batch.forward_mode, pooled=self.pooler(hidden, plan.pool_spans))
        return self.logits_processor(hidden, plan, forward_batch.forward_mode)
