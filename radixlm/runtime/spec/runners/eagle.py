"""An EAGLE head as the draft model (--speculative-algorithm EAGLE): models/eagle.py's head over the target's final
hidden states (EAGLE-1) or three of its layers' states (EAGLE-3, eagle_aux.py), or a DeepSeek-V3 target's own MTP
layer (models/deepseek_mtp.py, spec/mtp.py: pairs as EAGLE-1's), with its one layer's KV in a pool over the target's
slots (as STANDALONE's, draft_model.py; the MTP layer's: a latent pool).

The head's KV at the slot of position i is its pair (h_i, t_{i+1}) -- SGLang's layout. A pair needs the token after
its position, so it is written once that token is known: after each target pass is processed (catch_up), for the
positions of the pass's rows up to the request's newest token; the last pair's output is the first draft token.
The target's features of a pass are copied when it is launched (write_kv): a CUDA-graph replay reuses its
buffers. NOTE (caveat, as in SGLang): a radix-cache hit of P tokens reuses the pair at position P - 1, which the
writer of that prefix made with its own token P; where the new request continues otherwise, that one pair differs
from the request's own, which only lowers acceptance (verification keeps outputs exact)."""
from __future__ import annotations

import glob
import itertools
import os
from collections import deque
from dataclasses import dataclass

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from radixlm.runtime.spec.budget import head_config
from radixlm.runtime.spec.mtp import build_mtp_head, mtp_config, mtp_weights, uses_mtp
from radixlm.runtime.spec.runners.draft_model import DraftModelRunner
from radixlm.runtime.executor.forward_batch import IN_FLIGHT, ForwardBatch, ForwardMode, ModelWorkerBatch
from radixlm.runtime.executor.logits import LogitsPlan, LogitsProcessor
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.kernels.startup import EXTEND_WARMUP_LENS, uses_tree_masks
from radixlm.runtime.host_to_device import HostCopy, host_to_device
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import _default_dtype, initialize_dummy_weights, safetensors_weights_iterator
from radixlm.runtime.quantization import process_weights_after_loading
from radixlm.runtime.spec.runners.eagle_aux import AuxStates, aux_layers, is_eagle3
from radixlm.runtime.models.eagle import Eagle3Head, EagleHead


@dataclass
class PairSpan:
    """A request's pairs to write after a pass: positions [start, end), their tokens t_{start+1} .. t_end, the
    target's hidden states at the pass's rows `feature_rows` (consecutive, but for a tree draft's accepted path)."""

    row: int  # req_to_token row
    start: int
    end: int
    tokens: list[int]
    feature_rows: list[int]


class EagleRunner(DraftModelRunner):
    @torch.inference_mode()
    def _warm_up(self) -> None:
        """Catch-up passes take the target's features: the first one builds their kernels. Tree steps
        (--speculative-eagle-topk > 1, eagle_tree.py) take the head's own outputs: their masked extend kernels (both
        tiles, kernels/startup/kernel_variants.py) are built here, with dummy passes as the target's warm_up_extend."""
        if not uses_tree_masks(self.server_args, self.attn_backend.supports_tree_mask
                               and self.target.attn_backend.supports_tree_mask):
            return
        cfg = self.model_config
        for extend_lens in EXTEND_WARMUP_LENS:
            fb = self.model_runner.warmup_extend_batch(extend_lens, tree_masks=True)
            self.attn_backend.init_forward_metadata(fb)
            features = torch.zeros(fb.num_tokens, cfg.hidden_size, dtype=cfg.dtype, device=self.device)
            self.model(fb.input_ids, fb.positions, fb, features)
        if self.is_cuda:
            torch.cuda.synchronize()

    def _capture_graphs(self, max_bs: int) -> None:
        """Chain steps replay graphs; catch-up passes (target features, many rows a request) run eagerly."""
        self.capture_chain_graphs(max_bs)

    def _load(self, server_args: ServerArgs, target: ModelRunner
              ) -> tuple[ModelConfig, torch.nn.Module, LogitsProcessor]:
        """The head over the target's embeddings, with the target's lm_head: an EAGLE head's checkpoint, or the
        target's own MTP layer (spec/mtp.py)."""
        path = server_args.speculative_draft_model_path
        mtp = uses_mtp(server_args, target.model_config)
        cfg = mtp_config(target.model_config) if mtp else head_config(path, target.model_config)
        eagle3 = not mtp and is_eagle3(cfg.hf_config)
        with torch.device(target.device), _default_dtype(cfg.dtype):
            embed = target.model.model.embed_tokens
            if mtp:
                model = build_mtp_head(target.model_config, embed)
            else:
                model = (Eagle3Head(cfg.hf_config, embed, target.model_config.hidden_size) if eagle3
                         else EagleHead(cfg.hf_config, embed))
        model.eval()
        if server_args.load_format == "dummy":
            initialize_dummy_weights(model)
        else:
            model.load_weights(mtp_weights(target.model_config) if mtp else _checkpoint(path))
        if mtp:
            process_weights_after_loading(model)
        self.chain_graphs: CudaGraphRunner | None = None  # set by capture_chain_graphs (the runner's __init__)
        self.aux = AuxStates(target, aux_layers(cfg.hf_config, target.model_config.num_layers)) if eagle3 else None
        # Each launched target pass's features, until it is processed (passes are processed in launch order).
        self._passes: deque[tuple[ModelWorkerBatch, torch.Tensor]] = deque()
        rows, hidden = target.req_to_token_pool.size, cfg.hidden_size
        self._last_out = torch.zeros(rows, hidden, dtype=cfg.dtype, device=target.device)
        return cfg, model, target.logits_processor

    @torch.inference_mode()
    def write_kv(self, wb: ModelWorkerBatch) -> None:
        """At launch: the target's features of the pass (its pairs are written once its tokens are known)."""
        n = wb.num_rows
        features = self.aux.of_pass(n) if self.aux is not None else self.target.last_hidden[:n].clone()
        self._passes.append((wb, features))

    @torch.inference_mode()
    def catch_up(self, wb: ModelWorkerBatch, spans: list[PairSpan]) -> None:
        """After pass `wb` was processed: the head's pairs of its requests' new positions, in one pass; each
        request's last output is kept (the first draft token, when the last pair is at its newest token)."""
        while self._passes and self._passes[0][0] is not wb:
            self._passes.popleft()  # a pass whose results were dropped (a failed step)
        if not self._passes:
            return
        _, hidden = self._passes.popleft()
        spans = [s for s in spans if s.end > s.start]
        if not spans:
            return
        pool = self.req_to_token_pool
        lens = [s.end - s.start for s in spans]
        pos = [p for s in spans for p in range(s.start, s.end)]
        slots = pool.req_to_token.view(-1)[pool.flat_index([(s.row, s.start, s.end) for s in spans])]
        pairs = ModelWorkerBatch(
            input_ids=[t for s in spans for t in s.tokens], positions=pos, req_pool_indices=[s.row for s in spans],
            prefix_lens=[s.start for s in spans], extend_lens=lens, seq_lens=[s.end for s in spans],
            out_cache_loc=slots, logits=LogitsPlan())
        mode = ForwardMode.TOKEN_ROWS if all(n == 1 for n in lens) else ForwardMode.REQUEST_SPANS
        feature_rows = [r for s in spans for r in s.feature_rows]
        out = self._head(pairs, mode, hidden[host_to_device(feature_rows, torch.int64, self.device)])
        last = [end - 1 for end in itertools.accumulate(lens)]
        self._last_out[host_to_device([s.row for s in spans], torch.int64, self.device)] = \
            out[host_to_device(last, torch.int64, self.device)]

    def _head(self, wb: ModelWorkerBatch, mode: ForwardMode, features: torch.Tensor) -> torch.Tensor:
        fb = ForwardBatch.build(wb, mode, self.req_to_token_pool, self.token_to_kv_pool, self.attn_backend,
                                self.device)
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb.input_ids, fb.positions, fb, features)

    def _tokens(self, out: torch.Tensor) -> torch.Tensor:
        return self.model.draft_tokens(out, self.logits_processor.logits)

    def _chain_step(self, wb: ModelWorkerBatch, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A chain step's outputs and tokens: one graph replay where the step's rows fit one, else eager."""
        graphs = self.chain_graphs
        fb = ForwardBatch.build(wb, ForwardMode.TOKEN_ROWS, self.req_to_token_pool, self.token_to_kv_pool,
                                self.attn_backend, self.device)
        if graphs is None or not graphs.can_run(fb):
            self.attn_backend.init_forward_metadata(fb)
            out = self.model(fb.input_ids, fb.positions, fb, features)
            return out, self._tokens(out)
        view = graphs.runner
        view.model.features[: features.shape[0]].copy_(features)
        logits = graphs.replay(fb)
        out = view.last_hidden
        return out, self.model.draft_tokens(out, lambda _: logits)  # EAGLE-1: the replay's target logits

    def capture_chain_graphs(self, max_bs: int, use_graphs: bool = True) -> None:
        """CUDA graphs of chain steps (one row per request, features the head's own outputs) for up to max_bs
        requests (use_graphs=False: their padded passes run eagerly, as tests on the CPU do)."""
        view = _GraphView(self, _HeadWithFeatureBuffer(self.model, max_bs, self.model_config.hidden_size))
        self.chain_graphs = CudaGraphRunner(view, max_bs, use_graphs)

    @torch.inference_mode()
    def propose(self, rows: list[int], last_tokens: list[int], positions: list[int], steps: list[int],
                written: list[bool] | None = None) -> list[list[int]]:
        """Greedy chains from each request row's last catch-up output (its newest token is at positions[i]): the
        first token from that output, each next one from a head pass over (previous output, previous token) at
        the next position (its KV in a scratch slot). `written` must be unset: a head never drafts with a pass in
        flight (EagleSource.traits.guesses)."""
        assert not any(written or ()), "an EAGLE head drafts only from processed passes"
        n_steps = max(steps, default=0)
        if not n_steps:
            return [[] for _ in rows]
        self.point_at_scratch(rows, positions, [k - 1 for k in steps])
        rows_t = host_to_device(rows, torch.int64, self.device)
        out = self._last_out[rows_t]
        tokens = self._tokens(out)
        chosen = [tokens]
        for step in range(1, n_steps):
            active = [i for i in range(len(rows)) if steps[i] > step]
            self._token_buf[rows_t] = tokens
            pos = [positions[i] + step - 1 for i in active]
            wb = ModelWorkerBatch(
                input_ids=[IN_FLIGHT] * len(active), positions=pos, req_pool_indices=[rows[i] for i in active],
                prefix_lens=pos, extend_lens=[1] * len(active), seq_lens=[p + 1 for p in pos],
                out_cache_loc=host_to_device([self.scratch_slot(rows[i], step - 1) for i in active], torch.int64,
                                             self.device),
                logits=LogitsPlan(), has_in_flight=True, token_buf=self._token_buf)
            idx = host_to_device(active, torch.int64, self.device)
            new, new_tokens = self._chain_step(wb, out[idx])
            out, tokens = out.clone(), tokens.clone()
            out[idx] = new
            tokens[idx] = new_tokens
            chosen.append(tokens)
        got = HostCopy(torch.stack(chosen)).get()[0].tolist()
        return [[got[s][i] for s in range(steps[i])] for i in range(len(rows))]


class _HeadWithFeatureBuffer(torch.nn.Module):
    """The head with its features in a static buffer, called as CudaGraphRunner calls a model."""

    def __init__(self, head: torch.nn.Module, max_rows: int, dim: int):
        super().__init__()
        self.head = head
        w = head.feature_weight
        self.features = torch.zeros(max_rows, dim, dtype=w.dtype, device=w.device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> torch.Tensor:
        return self.head(input_ids, positions, forward_batch, self.features[: input_ids.shape[0]])


class _GraphView:
    """What CudaGraphRunner reads from a runner, for the head's chain steps."""

    def __init__(self, runner: "EagleRunner", model: torch.nn.Module):
        self.device, self.model, self.logits_processor = runner.device, model, runner.logits_processor
        self.req_to_token_pool, self.token_to_kv_pool = runner.req_to_token_pool, runner.token_to_kv_pool
        self.attn_backend = runner.attn_backend
        self.last_hidden: torch.Tensor | None = None  # set by each replay


def _checkpoint(path: str):
    """The head's tensors: safetensors files, else PyTorch .bin files (as the EAGLE authors publish them)."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        yield from safetensors_weights_iterator(files)
        return
    for f in sorted(glob.glob(os.path.join(path, "*.bin"))):
        yield from torch.load(f, map_location="cpu", weights_only=True).items()

