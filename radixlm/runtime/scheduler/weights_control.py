"""The scheduler's side of weight updates and memory release: one handler for every WeightsReqInput, run by the loop
when the requests sent before it have finished (SchedulerLoop holds what comes after it meanwhile), on every
tensor-parallel rank at the same turn. Each rank loads its own slice through the model's loader; a trainer's
broadcasts reach every rank through the weights-update group each rank joined."""
from __future__ import annotations

import logging
import time

from radixlm.runtime.distributed.weight_sync import GroupSpec, WeightsUpdateGroup, parse_dtype
from radixlm.runtime.executor.memory_saver import MemorySaver, MemoryTag, parse_tags
from radixlm.runtime.executor.weight_update import TensorMeta, WeightUpdateError, WeightUpdater
from radixlm.runtime.messages import (
    DestroyWeightsUpdateGroupReqInput, InitWeightsUpdateGroupReqInput, ReleaseMemoryOccupationReqInput,
    ResumeMemoryOccupationReqInput, UpdateWeightFromDiskReqInput, UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromTensorReqInput, WeightsReqInput, WeightsReqOutput,
)

logger = logging.getLogger(__name__)

UPDATES = (UpdateWeightFromDiskReqInput, UpdateWeightsFromTensorReqInput, UpdateWeightsFromDistributedReqInput)
MEMORY = (ReleaseMemoryOccupationReqInput, ResumeMemoryOccupationReqInput)
WEIGHTS_REQUESTS = (*UPDATES, InitWeightsUpdateGroupReqInput, DestroyWeightsUpdateGroupReqInput, *MEMORY)


class WeightsControl:
    def __init__(self, sched) -> None:
        self.sched = sched
        self.groups: dict[str, WeightsUpdateGroup] = {}
        self.num_updates = 0
        self._memory: MemorySaver | None = None  # made on first use, as the updater

    @property
    def memory(self) -> MemorySaver:
        if self._memory is None:
            self._memory = MemorySaver(self.sched.runner)
        return self._memory

    @property
    def updater(self) -> WeightUpdater:
        runner = self.sched.runner
        return WeightUpdater(runner.model, runner.model_config, runner.parallel, runner.device,
                             before_load=runner.unpack_weights)

    @property
    def released(self) -> bool:
        return self._memory is not None and bool(self._memory.released)

    def handle(self, msg: WeightsReqInput) -> WeightsReqOutput:
        """Answers msg; the scheduler is idle (no request queued or running)."""
        try:
            if isinstance(msg, UPDATES):
                return self._update(msg)
            if isinstance(msg, InitWeightsUpdateGroupReqInput):
                return self._init_group(msg)
            if isinstance(msg, DestroyWeightsUpdateGroupReqInput):
                group = self.groups.pop(msg.group_name, None)
                if group is None:
                    return self._answer(False, f"no weights-update group named {msg.group_name!r}")
                group.destroy()
                return self._answer(True, f"destroyed weights-update group {msg.group_name!r}")
            return self._memory_request(msg)
        except ValueError as e:  # refused before anything changed
            return self._answer(False, str(e))
        except Exception as e:  # noqa: BLE001 - past the checks (a device error): reported, the loop goes on
            logger.exception("weights request %s failed", type(msg).__name__)
            return self._answer(False, f"failed after the checks, the weights may be partly updated: "
                                       f"{type(e).__name__}: {e}")

    def _answer(self, success: bool, message: str, paused: int = 0) -> WeightsReqOutput:
        if not success:
            logger.warning("weights request refused: %s", message)
        return WeightsReqOutput(success, message, self.sched.weight_version, paused)

    def _update(self, msg) -> WeightsReqOutput:
        if MemoryTag.WEIGHTS in self.memory.released:
            return self._answer(False, "the weights are released (/release_memory_occupation): resume them first")
        t0 = time.perf_counter()
        up = self.updater
        try:
            if isinstance(msg, UpdateWeightFromDiskReqInput):
                n = up.from_disk(msg.model_path, msg.load_format, self.sched.args)
            elif isinstance(msg, UpdateWeightsFromTensorReqInput):
                n = up.from_tensors(list(msg.named_tensors), msg.load_format)
            else:
                group = self.groups.get(msg.group_name)
                if group is None:
                    return self._answer(False, f"no weights-update group named {msg.group_name!r}: call "
                                               "/init_weights_update_group first")
                metas = _metas(msg)
                n = up.from_broadcast(metas, group.receive, msg.load_format)
        except WeightUpdateError as e:
            return self._answer(False, f"weights not updated (the old weights keep serving): {e}")
        finally:
            self.sched.runner.refresh_weights()  # packs what the load unpacked: nothing where it was refused
        self.num_updates += 1
        self.sched.weight_version = msg.weight_version or str(self.num_updates)
        if msg.flush_cache:
            self.sched.flush_cache()  # idle: it succeeds
        message = f"updated {n} weight tensors in {time.perf_counter() - t0:.2f} s"
        logger.info("%s; weight_version %s", message, self.sched.weight_version)
        return self._answer(True, message)

    def _init_group(self, msg: InitWeightsUpdateGroupReqInput) -> WeightsReqOutput:
        if msg.group_name in self.groups:
            return self._answer(False, f"weights-update group {msg.group_name!r} already exists")
        parallel = self.sched.runner.parallel
        if msg.backend == "nccl" and not self.sched.runner.is_cuda:
            return self._answer(False, "backend nccl needs a CUDA device; use gloo on the CPU")
        spec = GroupSpec(msg.master_address, msg.master_port, msg.rank_offset + parallel.tp_rank, msg.world_size,
                         msg.group_name, msg.backend, self.sched.args.dist_timeout)
        if spec.rank == 0:
            return self._answer(False, "rank_offset must leave rank 0 to the trainer")
        try:
            self.groups[msg.group_name] = WeightsUpdateGroup(spec)
        except (RuntimeError, OSError) as e:  # a timeout or a refused connection: nothing was joined
            return self._answer(False, f"could not join {msg.group_name!r}: {e}")
        return self._answer(True, f"joined weights-update group {msg.group_name!r} as rank {spec.rank}")

    def _memory_request(self, msg) -> WeightsReqOutput:
        if not self.sched.args.enable_memory_saver:
            return self._answer(False, "memory release needs the server started with --enable-memory-saver")
        tags = parse_tags(msg.tags)
        if isinstance(msg, ReleaseMemoryOccupationReqInput):
            if MemoryTag.KV_CACHE in tags:
                self.sched.flush_cache()  # the KV is lost: nothing may match it afterwards
            done = self.memory.release(tags)
            return self._answer(True, f"released {sorted(t.value for t in done)}")
        done = self.memory.resume(tags)
        return self._answer(True, f"resumed {sorted(t.value for t in done)}")


def _metas(msg: UpdateWeightsFromDistributedReqInput) -> list[TensorMeta]:
    if not (len(msg.names) == len(msg.dtypes) == len(msg.shapes)):
        raise ValueError(f"names, dtypes and shapes must have one entry per tensor (got {len(msg.names)}, "
                         f"{len(msg.dtypes)}, {len(msg.shapes)})")
    metas = []
    for name, dtype, shape in zip(msg.names, msg.dtypes, msg.shapes):
        if not isinstance(name, str) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"tensor {name!r}: a name and a shape of non-negative ints are needed, got {shape!r}")
        metas.append(TensorMeta(name, tuple(shape), parse_dtype(dtype)))
    return metas
