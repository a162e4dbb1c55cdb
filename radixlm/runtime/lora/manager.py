"""The executor's side of LoRA serving (one per ModelRunner, per tensor-parallel rank): the adapters' host copies,
the slot buffers attached to the model's linear layers, and each pass's swaps and row-to-slot info. Which adapter
goes to which slot is the scheduler's decision (lora/slots.py); this only carries it out."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.args.choices import LORA_TARGET_MODULES, MAX_LORA_RANK
from radixlm.runtime.lora.adapter import HostAdapter
from radixlm.runtime.lora.config import LoraSpec, LoraTarget, PeftConfig, normalize_modules, targets_of
from radixlm.runtime.lora.layer import LoraLayer, LoraPassContext
from radixlm.runtime.lora.ops import LoraBatchInfo
from radixlm.runtime.lora.slots import LoraBatch

logger = logging.getLogger(__name__)

SUBMODULE = {LoraTarget.QKV: "self_attn.qkv_proj", LoraTarget.O: "self_attn.o_proj",
             LoraTarget.GATE_UP: "mlp.gate_up_proj", LoraTarget.DOWN: "mlp.down_proj"}


@dataclass(frozen=True)
class LoraOptions:
    max_loras_per_batch: int
    max_lora_rank: int
    target_modules: tuple[str, ...]  # PEFT names
    max_loaded_loras: int | None
    backend: str  # --lora-backend

    @staticmethod
    def from_args(args: ServerArgs) -> "LoraOptions":
        """Unset rank and targets are inferred from --lora-paths' adapters (SGLang's rule), else 64 and all."""
        specs = tuple(LoraSpec.parse(p) for p in args.lora_paths or ())
        configs = [PeftConfig.read(s.path) for s in specs]
        rank = args.max_lora_rank or max((c.r for c in configs), default=MAX_LORA_RANK)
        if args.lora_target_modules:
            modules = normalize_modules(args.lora_target_modules)
        elif configs:
            modules = normalize_modules([m for c in configs for m in c.target_modules])
        else:
            modules = LORA_TARGET_MODULES
        return LoraOptions(args.max_loras_per_batch, rank, modules, args.max_loaded_loras, args.lora_backend)


class LoraManager:
    def __init__(self, model: torch.nn.Module, options: LoraOptions, num_layers: int, dtype: torch.dtype,
                 device: str, tp_rank: int = 0):
        self.options = options
        self.num_layers = num_layers
        self.dtype = dtype
        self.device = device
        use_triton = options.backend == "triton" and torch.device(device).type == "cuda"
        self.context = LoraPassContext(use_triton=use_triton,
                                       side_stream=torch.cuda.Stream(torch.device(device)) if use_triton else None)
        self.layers: dict[tuple[int, LoraTarget], LoraLayer] = {}
        decoder = getattr(getattr(model, "model", None), "layers", None)
        if decoder is None:
            raise ValueError(f"LoRA serving does not support {type(model).__name__} (no decoder layers found)")
        for i, layer in enumerate(decoder):
            for target in targets_of(options.target_modules):
                try:
                    linear = layer.get_submodule(SUBMODULE[target])
                except AttributeError:
                    raise ValueError(f"LoRA target {target.module} is not a dense projection of "
                                     f"{type(model).__name__}: leave it out of --lora-target-modules") from None
                linear.lora = self.layers[(i, target)] = LoraLayer(
                    linear, target, options.max_loras_per_batch, options.max_lora_rank, self.context, dtype, device,
                    tp_rank)
        self.scalings = torch.zeros(options.max_loras_per_batch, dtype=torch.float32, device=device)
        self.adapters: dict[str, HostAdapter] = {}  # their configs (the weights are in packs)
        self.packs: dict[str, dict[tuple[int, LoraTarget], tuple[torch.Tensor, torch.Tensor]]] = {}
        self.slot_ids: list[str | None] = [None] * options.max_loras_per_batch  # what each slot holds now

    def load_adapter(self, lora_id: str, name: str, path: str) -> HostAdapter:
        """Reads and checks an adapter into host memory (ValueError naming what is wrong)."""
        if lora_id in self.adapters:
            raise ValueError(f"LoRA adapter id {lora_id!r} is loaded already")
        limit = self.options.max_loaded_loras
        if limit is not None and len(self.adapters) >= limit:
            raise ValueError(f"{len(self.adapters)} LoRA adapters are loaded, the --max-loaded-loras limit: unload "
                             "one first")
        adapter = HostAdapter.read(lora_id, name, path, self.num_layers, self.dtype, self.options.target_modules,
                                   self.options.max_lora_rank)
        for (layer, module), (a, b) in adapter.weights.items():
            target, part = LoraTarget.of(module)
            self.layers[(layer, target)].check(part, a, b, f"LoRA adapter {name!r} layer {layer} {module}")
        nbytes = adapter.nbytes()
        # Each layer's slot contents, ready to copy (pinned on CUDA: a swap-in's copies do not wait for the device).
        pin = torch.device(self.device).type == "cuda"
        packs = {}
        for (layer, target), ll in self.layers.items():
            pack = ll.pack([adapter.weights.get((layer, part)) for part in target.parts])
            if pack is not None:
                packs[(layer, target)] = tuple(t.pin_memory() for t in pack) if pin else pack
        self.packs[lora_id] = packs
        self.adapters[lora_id] = dataclasses.replace(adapter, weights={})  # the packs hold the weights now
        logger.info("LoRA adapter %s loaded from %s (rank %d, %s, %.1f MiB)", name, path, adapter.rank,
                    ",".join(adapter.config.target_modules), nbytes / 2**20)
        return self.adapters[lora_id]

    def unload_adapter(self, lora_id: str) -> None:
        if self.adapters.pop(lora_id, None) is None:
            raise ValueError(f"no LoRA adapter of id {lora_id!r} is loaded")
        del self.packs[lora_id]
        for slot, held in enumerate(self.slot_ids):
            if held == lora_id:
                self.slot_ids[slot] = None

    def _swap_in(self, slot: int, lora_id: str) -> None:
        adapter, packs = self.adapters[lora_id], self.packs[lora_id]
        for key, ll in self.layers.items():
            ll.load(slot, packs.get(key))
        self.scalings[slot] = adapter.config.scaling
        self.slot_ids[slot] = lora_id

    def prepare(self, batch: LoraBatch | None, extend_lens: list[int], host_only: bool = False) -> LoraBatchInfo | None:
        """Carries out the pass's swaps and returns its row-to-slot info (also set as the layers' context).
        host_only: the pass replays a CUDA graph, which reads only the rows' slots on the host."""
        if batch is None:
            self.context.info = None
            return None
        for slot, lora_id in batch.loads:
            self._swap_in(slot, lora_id)
        if all(s < 0 for s in batch.req_slots):
            # No row uses an adapter: the pass runs as the base model's (fused GEMMs, no LoRA kernels, no table).
            self.context.info = None
            return None
        if host_only:
            info = LoraBatchInfo.host_only(list(batch.req_slots), extend_lens, self.scalings)
        else:
            info = LoraBatchInfo.build(list(batch.req_slots), extend_lens, self.scalings, self.device,
                                       groups=not self.context.use_triton)
        self.context.info = info
        return info

    def warmup_info(self, extend_lens: list[int], gather: bool = False) -> LoraBatchInfo:
        """Start-up's dummy passes (kernels/startup): every row on slot 0, which holds zeros until the first swap, so
        the LoRA kernels are built (in parallel, by the warm-up's discovery run) without changing the pass. gather:
        the gather form of graph decode (on CUDA with the Triton kernels), whose kernels' variants do not depend on
        the row count: one pass builds those of every graph."""
        if any(self.slot_ids):
            raise RuntimeError("LoRA warm-up passes must run before any adapter is swapped in")
        if gather and self.context.use_triton:
            inputs = self.graph_inputs(sum(extend_lens))
            inputs.fill([0] * sum(extend_lens))
            return inputs.info(sum(extend_lens))
        return LoraBatchInfo.build([0] * len(extend_lens), list(extend_lens), self.scalings, self.device,
                                   groups=not self.context.use_triton)

    def graph_inputs(self, max_rows: int):
        """The static gather-form buffers of CUDA-graph decode (lora/graph.py)."""
        from radixlm.runtime.kernels.lora.config import config_for
        from radixlm.runtime.lora.graph import LoraGraphInputs

        return LoraGraphInputs(max_rows, self.options.max_loras_per_batch, self.scalings, self.device,
                               config_for(self.device))
