"""EAGLE-3's features: three of the target's hidden states -- the residual stream entering layers 2, L/2 and L - 3
(SGLang's default), or those the head's config names (eagle_config.eagle_aux_hidden_state_layer_ids: the outputs
of those layers) -- captured by forward pre-hooks on the target's layers (layer L: its final norm). A CUDA-graph
replay runs no hooks: the target's graphs are captured again with them, and each size's captured states are that
size's buffers, which its replays refill."""
from __future__ import annotations

import torch

from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner


def is_eagle3(hf_config) -> bool:
    archs = getattr(hf_config, "architectures", None) or []
    return any("Eagle3" in a for a in archs) or getattr(hf_config, "draft_vocab_size", None) is not None


def aux_layers(hf_config, num_layers: int) -> list[int]:
    """The layers whose input is captured (num_layers: the final norm's)."""
    eagle = getattr(hf_config, "eagle_config", None) or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    return [i + 1 for i in ids] if ids else [2, num_layers // 2, num_layers - 3]


class AuxStates:
    def __init__(self, target, layers: list[int]):
        model = target.model.model
        if any(not 0 <= i <= len(model.layers) for i in layers):
            raise ValueError(f"EAGLE-3 feature layers {layers} outside the target's {len(model.layers)} layers")
        if getattr(model, "norm_reduce", None) is not None or any(getattr(layer, "input_reduce", None) is not None
                                                                  for layer in model.layers):
            # (a draft runs with tp_size 1 only: DraftModelRunner)
            raise ValueError("EAGLE-3 features need the target's summed states; its layers leave the sum over ranks "
                             "to the next norm")
        self.target = target
        self.n = len(layers)
        self._eager: dict[int, torch.Tensor] = {}
        self._graph: dict[tuple[int, int], torch.Tensor] = {}
        self._eager_passes = self._read_passes = 0
        for k, i in enumerate(layers):
            is_layer = i < len(model.layers)
            (model.layers[i] if is_layer else model.norm).register_forward_pre_hook(self._hook(k, is_layer))
        graphs = target.graph_runner
        if graphs is not None and graphs.use_graphs:
            target.graph_runner = CudaGraphRunner(target, graphs.max_bs)  # captured again, now with the hooks
        # The capture's warm-up passes ran the hooks eagerly: the next pass read is the first real one.
        self._read_passes = self._eager_passes

    def _hook(self, k: int, is_layer: bool):
        def hook(module, args):
            # A layer's input is (positions, hidden, forward_batch, residual), the final norm's (hidden, residual):
            # the stream is hidden + residual (the add is fused into the next norm).
            hidden, residual = (args[1], args[3]) if is_layer else (args[0], args[1] if len(args) > 1 else None)
            state = hidden if residual is None else hidden + residual
            if state.is_cuda and torch.cuda.is_current_stream_capturing():
                self._graph[(k, state.shape[0])] = state
            else:
                self._eager[k] = state
                self._eager_passes += k == 0

        return hook

    def of_pass(self, num_rows: int) -> torch.Tensor:
        """The features (num_rows, 3 h) of the target pass just launched (a copy)."""
        if self._eager_passes != self._read_passes:
            self._read_passes = self._eager_passes
            states = [self._eager[k][:num_rows] for k in range(self.n)]
        else:  # replayed: no hook ran
            size = self.target.graph_runner.padded_size(num_rows)
            states = [self._graph[(k, size)][:num_rows] for k in range(self.n)]
        return torch.cat(states, dim=-1)
