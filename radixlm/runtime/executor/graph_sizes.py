"""How many rows a ModelRunner's CUDA graphs hold, and which passes replay them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.args import ServerArgs

# Eager decode passes of 512-1024 rows (the first ~120 steps of ShareGPT-like, 1000 requests at once) cost the host
# about as long as the device takes: replayed, the host keeps ahead.
CUDA_GRAPH_DEFAULT_MAX_BS = 1024
# Passes with several rows for some request (a prompt's, drafts) replay up to this many rows: each row reads its
# whole context through the decode kernel, which past this costs more than the extend kernels' one walk.
MULTI_ROW_REPLAY_MAX_ROWS = 512
# Graphs hold this many rows per running request: a pass can carry a row per draft token, and a small prefill runs as
# TOKEN_ROWS with a row per token.
DECODE_ROWS_PER_REQ = 16


@dataclass(frozen=True)
class GraphSizes:
    """What decides a runner's graphs: whether it may capture any (CUDA, not --disable-cuda-graph, a backend and a
    model that can) and the most rows a decode pass can have."""

    enabled: bool
    max_pass_rows: int
    max_bs_flag: int | None  # --cuda-graph-max-bs

    @classmethod
    def of(cls, args: ServerArgs, device: str, attn_backend, model: torch.nn.Module, lora, pooler,
           max_running_requests: int) -> "GraphSizes":
        # Eager passes for embeddings (prefills, and the graphs yield logits), under --lora-backend torch_native
        # (its graph-safe form gathers every row's A and B: a CPU stand-in), and for a model whose attention reads
        # host data per pass (MLA's torch path).
        lora_eager = lora is not None and not lora.context.use_triton
        enabled = (torch.device(device).type == "cuda" and not args.disable_cuda_graph
                   and attn_backend.supports_cuda_graph and not lora_eager and pooler is None
                   and getattr(model, "supports_cuda_graph", True))
        return cls(enabled, max_running_requests * DECODE_ROWS_PER_REQ, args.cuda_graph_max_bs)

    @property
    def max_bs(self) -> int:
        """The largest batch a CUDA graph is captured for (0: no graphs)."""
        return min(self.max_bs_flag or CUDA_GRAPH_DEFAULT_MAX_BS, self.max_pass_rows) if self.enabled else 0
