"""CUDA-graph decode: the decode forward pass (model and lm_head over every row) captured once per batch size at
startup and replayed for any decode batch up to the largest size, padded to the next captured size -- or to a
larger one that replays faster: cuBLAS's cost is not monotonic in the row count (on an H100, Llama-3.1-8B's
gate_up and down take 211 us at 288 rows, 186 us at 304), so start-up times the replays of the graphs of 192-512
rows and pads each size to the cheapest graph at or above it (choose_padding).

Under --enable-lora each size has two graphs: one with the LoRA decode kernels (lora/graph.py: each row's adapter
slot in a static table filled before each replay, so one capture serves any mix of adapters), and the base model's
(fused GEMMs, no LoRA kernel), which a pass with no adapter rows replays with no table to fill. The base graph writes
its logits and hidden states into the LoRA graph's buffers (one copy each): no second set of output buffers.

A replay copies the batch's inputs into static buffers; padded rows decode token 0 at position 0 of request row 0
and write their K/V to the pool's dummy slot 0, so they touch nothing real. The attention backend gives captured
passes a fixed split count (its kernels read the sequence lengths from device memory, so one graph serves every
length)."""
from __future__ import annotations

import bisect
import logging
import time
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixlm.runtime.executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


# Graphs of PAD_TIMING_MIN_BS to PAD_TIMING_MAX_BS rows are timed at start-up (below, the weight reads dominate and
# padding is cheap; above, the few passes that large cost more start-up than they would save).
PAD_TIMING_MIN_BS = 192
PAD_TIMING_MAX_BS = 512
# A larger graph is chosen only when it replays at least this much faster (timing noise picks nothing).
PAD_TIMING_MARGIN = 0.03


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, every 16 up to 384, every 32 up to 512, every 64 beyond; always ending at
    max_bs."""
    sizes = [b for b in (1, 2, 4) if b < max_bs]
    b = 8
    while b < max_bs:
        sizes.append(b)
        b += 8 if b < 64 else 16 if b < 384 else 32 if b < 512 else 64
    sizes.append(max_bs)
    return sizes


def choose_padding(sizes: list[int], replay_s: dict[int, float]) -> dict[int, int]:
    """For each captured size, the graph its batches replay: itself, unless a larger timed graph replays at least
    PAD_TIMING_MARGIN faster (then the cheapest such); untimed sizes keep their own."""
    chosen: dict[int, int] = {}
    best = None
    for s in reversed(sizes):
        if s in replay_s and (best is None or replay_s[best] >= replay_s[s] * (1 - PAD_TIMING_MARGIN)):
            best = s
        chosen[s] = best if s in replay_s else s
    return chosen


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner", max_bs: int, use_graphs: bool = True):
        """use_graphs=False runs the same padded passes eagerly (how the padding is tested without a GPU)."""
        self.runner = model_runner
        self.use_graphs = use_graphs
        self.capture_bs = capture_batch_sizes(max_bs)
        self.max_bs = self.capture_bs[-1]
        dev = model_runner.device
        n = self.max_bs
        # The rows of ForwardBatch.decode_rows: input ids, positions, request rows, sequence lengths, and for a model
        # that takes them rotary offsets (an even row length keeps every row 16-byte aligned). Padded rows take
        # self.pad's values: 0, 0, 0, 1 (and 0).
        offsets = getattr(model_runner.model, "takes_rope_offsets", False)
        self.rows = torch.zeros(5 if offsets else 4, n + n % 2, dtype=torch.int64, device=dev)[:, :n]
        self.rows[3].fill_(1)
        self.pad = self.rows.clone()
        self.input_ids, self.positions, self.req_pool_indices, self.seq_lens = self.rows[:4]
        self.rope_offsets = self.rows[4] if offsets else None
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        # Under --enable-lora: each row's adapter slot, grouped by slot (lora/graph.py), refilled before each replay.
        lora = getattr(model_runner, "lora", None)
        self.lora_inputs = None if lora is None else lora.graph_inputs(n)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.base_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # under --enable-lora: passes with no adapter rows
        self.outputs: dict[int, torch.Tensor] = {}
        self.hidden: dict[int, torch.Tensor] = {}  # final hidden states of each size's pass (an EAGLE head's input)
        self.capture_seconds = 0.0
        self.replay_seconds: dict[int, float] = {}  # the timed graphs' replay times (set by _time_replays)
        self.pad_to: dict[int, int] = {s: s for s in self.capture_bs}  # captured size -> the graph it replays
        if use_graphs:
            self._capture_all()
            self._time_replays()

    def padded_size(self, bs: int) -> int:
        """The graph a decode batch of bs rows replays."""
        return self.pad_to[self.capture_bs[bisect.bisect_left(self.capture_bs, bs)]]

    @torch.inference_mode()
    def _time_replays(self) -> None:
        """Replays each graph of PAD_TIMING_MIN_BS to PAD_TIMING_MAX_BS rows twice (on its capture's padding inputs,
        which touch only the dummy slot; the first replay also uploads the graph) and sets pad_to from the faster."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for bs in self.capture_bs:
            if not PAD_TIMING_MIN_BS <= bs <= PAD_TIMING_MAX_BS:
                continue
            times = []
            for _ in range(2):
                start.record()
                self.graphs[bs].replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            self.replay_seconds[bs] = min(times)
        self.pad_to = choose_padding(self.capture_bs, self.replay_seconds)
        moved = {s: p for s, p in self.pad_to.items() if p != s}
        if moved:
            logger.info("decode batches replay larger graphs where those run faster: %s", moved)

    def can_run(self, fb: ForwardBatch) -> bool:
        # A pass with shared prefixes runs eagerly: the graphs read every row's whole sequence.
        return (fb.forward_mode.is_token_rows() and fb.decode_rows is not None and 0 < fb.batch_size <= self.max_bs
                and (fb.rope_offsets is None or self.rope_offsets is not None) and not fb.shared_prefixes)

    def _static_batch(self, bs: int, seq_lens_cpu: list[int] | None) -> ForwardBatch:
        """seq_lens_cpu: the real lengths (eager runs); None while capturing, where nothing may depend on them."""
        r = self.runner
        fb = ForwardBatch(
            forward_mode=ForwardMode.TOKEN_ROWS, batch_size=bs, input_ids=self.input_ids[:bs],
            positions=self.positions[:bs], req_pool_indices=self.req_pool_indices[:bs], seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=seq_lens_cpu or [1] * bs, out_cache_loc=self.out_cache_loc[:bs],
            req_to_token_pool=r.req_to_token_pool, token_to_kv_pool=r.token_to_kv_pool, attn_backend=r.attn_backend,
            rope_offsets=None if self.rope_offsets is None else self.rope_offsets[:bs],
        )
        if seq_lens_cpu is None:
            r.attn_backend.init_forward_metadata_static(fb)
        else:
            r.attn_backend.init_forward_metadata(fb)
        return fb

    def _run(self, bs: int, seq_lens_cpu: list[int] | None = None, lora: bool = True) -> torch.Tensor:
        """lora=False under --enable-lora: the base model's pass (no adapter rows), its hidden states and logits
        copied into the LoRA pass's buffers of the same size (captured before it)."""
        fb = self._static_batch(bs, seq_lens_cpu)
        if self.lora_inputs is not None:
            # What every adapted layer reads (None: the base model's pass)
            self.runner.lora.context.info = self.lora_inputs.info(bs) if lora else None
        hidden = self.runner.model(fb.input_ids, fb.positions, fb)
        logits = self.runner.logits_processor.logits(hidden)
        if not lora and bs in self.outputs:
            self.hidden[bs].copy_(hidden)
            return self.outputs[bs].copy_(logits)
        self.hidden[bs] = hidden  # captured: a static buffer each replay of bs rows refills
        return logits

    @torch.inference_mode()
    def _capture_all(self) -> None:
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # Largest first: the smaller graphs then fit in the memory the larger ones already took from the pool.
            for bs in reversed(self.capture_bs):
                for _ in range(2):  # warm-up: compiles the Triton kernels and settles lazily built caches
                    self._run(bs)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[bs] = self._run(bs)
                self.graphs[bs] = graph
                if self.lora_inputs is not None:
                    self._run(bs, lora=False)  # its kernels were built by the warm-up passes
                    stream.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self._run(bs, lora=False)
                    self.base_graphs[bs] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - t0
        logger.info("captured CUDA graphs for decode batch sizes %s in %.2f s (%.0f MiB of graph memory)",
                    self.capture_bs, self.capture_seconds, torch.cuda.memory_reserved() / 2**20)

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits (bs, vocab) float32 of a decode batch. They live in a static buffer that the next replay of the
        same size overwrites: callers consume them (in stream order) before that."""
        bs = fb.batch_size
        padded = self.padded_size(bs)
        self.rows[: len(fb.decode_rows), :bs].copy_(fb.decode_rows)
        if self.rope_offsets is not None and fb.rope_offsets is None:
            self.rope_offsets[:bs].zero_()
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        if padded > bs:
            self.rows[:, bs:padded].copy_(self.pad[:, : padded - bs])
            self.out_cache_loc[bs:padded].zero_()
        # Under --enable-lora a pass with adapter rows fills the table (padded rows: the base model); one without
        # replays the base model's graph.
        lora = self.lora_inputs is not None and fb.lora is not None and fb.lora.uses_lora
        if lora:
            self.lora_inputs.fill(fb.lora.host_row_slots)
        if self.use_graphs:
            (self.graphs if lora or self.lora_inputs is None else self.base_graphs)[padded].replay()
            logits = self.outputs[padded][:bs]
        else:
            with torch.inference_mode():
                logits = self._run(padded, fb.seq_lens_cpu + [1] * (padded - bs),
                                   lora=lora or self.lora_inputs is None)[:bs]
        self.runner.last_hidden = self.hidden[padded][:bs]
        return logits
