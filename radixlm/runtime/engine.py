"""Engine: the offline Python API. It validates and tokenizes requests and runs the scheduler in a background thread;
the requests in flight and their SGLang-shaped results are engine_results.py's, the control messages and their
answers engine_control.py's."""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import threading
import time

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.embeddings import build_embed_requests
from radixlm.runtime.engine_control import ControlChannel, LoadLoraCall, UnloadLoraCall
from radixlm.runtime.engine_results import EngineHealth, ResultCollector
from radixlm.runtime.front import FrontLimits, RequestBuilder
from radixlm.runtime.multimodal.media import MediaLoader, MediaPolicy
from radixlm.runtime.multimodal.processor import MultimodalProcessor
from radixlm.runtime.messages import (
    AbortReq, DestroyWeightsUpdateGroupReqInput, InitWeightsUpdateGroupReqInput, LoRAUpdateOutput,
    ReleaseMemoryOccupationReqInput, ResumeMemoryOccupationReqInput, ShutdownReq, TokenizedGenerateReqInput,
    UpdateWeightFromDiskReqInput, UpdateWeightsFromDistributedReqInput, UpdateWeightsFromTensorReqInput,
)
from radixlm.runtime.lora.registry import LoraRegistry, startup_refs
from radixlm.runtime.scheduler.event_loop import QueueInbox, SchedulerLoop, build_scheduler

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, model_path: str = "default", **kwargs):
        self.server_args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        self._inbox = QueueInbox()
        self._error: BaseException | None = None
        self._stopped = threading.Event()
        self._rank_procs: list = []  # tensor parallel: ranks 1.. (set by _join_ranks)
        self._health = EngineHealth(lambda: self._error, self._stopped.is_set, lambda: self._thread.is_alive())
        self._control = ControlChannel(self._inbox.put, self._health)
        ready = threading.Event()
        # NOTE: every torch op of the engine (loading included) runs on this one thread. Once a thread has
        # run an OpenMP region, libgomp throttles the thread teams of all other threads, which halves the
        # scheduler's speed on a 2-core machine if the caller's thread had touched torch first.
        self._thread = threading.Thread(target=self._run, args=(ready,), name="radixlm-scheduler", daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            raise self._error

    def _setup(self) -> None:
        args = self.server_args
        t0 = time.perf_counter()
        parallel, device = self._join_ranks(args)
        built = build_scheduler(args, parallel, device)
        if self._rank_procs:
            from radixlm.runtime.launch import READY_TIMEOUT_S, wait_ranks

            wait_ranks(self._rank_procs, time.monotonic() + READY_TIMEOUT_S)
        self.model_config, self.tokenizer = built.model_config, built.tokenizer
        self.runner, self.scheduler = built.runner, built.scheduler
        self.context_len = self.model_config.context_len
        self.vocab_size = self.model_config.vocab_size
        self.builder = RequestBuilder(self.tokenizer, FrontLimits(
            self.vocab_size, self.context_len, self.runner.max_total_num_tokens, args.disable_radix_cache,
            args.max_logprobs, self.runner.pooler.dim if self.runner.pooler is not None else 0),
            MultimodalProcessor.for_model(self.model_config.model_path, self.tokenizer,
                                          MediaLoader(MediaPolicy.from_args(args))),
            LoraRegistry(args.enable_lora, startup_refs(args.lora_paths)), args.reasoning_parser)
        self._results = ResultCollector(self._inbox.put, self.tokenizer, self._health)
        logger.info("engine ready in %.1fs", time.perf_counter() - t0)

    def _join_ranks(self, args: ServerArgs):
        """Tensor parallel: ranks 1.. in processes of their own, rank 0 on this thread; (Parallel, device)."""
        from radixlm.runtime.distributed.setup import RankPlacement, init_distributed

        if args.tp_size == 1:
            return init_distributed(args, None)
        if args.nnodes > 1:
            raise ValueError("the offline Engine runs on one node: use `radixlm serve` with --nnodes")
        import multiprocessing as mp

        from radixlm.runtime.launch import rank_init_method, start_ranks

        init_method = rank_init_method(args)
        self._rank_procs = start_ranks(args, None, mp.get_context("spawn"), init_method, skip_rank0=True)
        return init_distributed(args, RankPlacement(0, init_method))

    def _run(self, ready: threading.Event) -> None:
        try:
            self._setup()
        except BaseException as e:  # noqa: BLE001 - re-raised in the constructor
            self._error = e
            return
        finally:
            ready.set()
        self._loop()

    # ------------------------------------------------------------------ scheduler thread
    def _loop(self) -> None:
        loop = SchedulerLoop(self.scheduler, self._inbox, deliver=self._results.deliver, reply=self._control.reply,
                             keep_going=lambda: not self._stopped.is_set(), parallel=self.runner.parallel)
        try:
            loop.run()
        except BaseException as e:  # noqa: BLE001 - surfaced to every waiting caller
            logger.exception("scheduler failed")
            self._error = e
            self._results.fail(e)

    # ------------------------------------------------------------------ public API
    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False, logprob_start_len=None,
                 top_logprobs_num=None, return_text_in_logprobs=False, stream=False, rid=None, extra_key=None,
                 image_data=None, video_data=None, lora_path=None, priority=None, timeout_s=None, bootstrap=None):
        """lora_path: a loaded adapter's name, or a list with one per prompt (None: the base model); priority: higher
        first with --enable-priority-scheduling (None: the server's default); timeout_s: aborted that many seconds
        after the scheduler received it (finish_reason abort, with what it generated)."""
        built = self.builder.build(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                   top_logprobs_num, rid, extra_key, stream, image_data, video_data, lora_path,
                                   priority, timeout_s, bootstrap)
        if stream:
            return self._results.stream(built.msgs[0], return_text_in_logprobs)
        self._results.run_prefixes(built)
        results = self._run_all(built.msgs, return_text_in_logprobs)
        return results if built.as_list else results[0]

    def _run_all(self, msgs: list[TokenizedGenerateReqInput], return_text: bool = False) -> list[dict]:
        """Submits msgs and waits for all of them; their final snapshots in order."""
        return self._results.run_all(msgs, return_text)

    def encode(self, prompt=None, input_ids=None, dimensions: int | None = None, rid: str | None = None):
        """Pooled outputs (--is-embedding): {"embedding", "meta_info"} for a prompt, a list for a list of prompts;
        prompt may also be a list of [query, document] pairs (a cross-encoder's scores)."""
        pairs = None
        if isinstance(prompt, list) and prompt and all(isinstance(p, (list, tuple)) for p in prompt):
            prompt, pairs = None, prompt
        built = build_embed_requests(self.builder, prompt, input_ids, pairs, dimensions, rid)
        results = self._run_all(built.msgs)
        for r in results:
            if "embedding" not in r:
                raise RuntimeError(f"encoding failed: {r['meta_info']['finish_reason']}")
        return results if built.as_list else results[0]

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                             logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False,
                             stream=False, rid=None, extra_key=None, image_data=None, video_data=None,
                             lora_path=None, priority=None, timeout_s=None):
        built = self.builder.build(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                   top_logprobs_num, rid, extra_key, stream, image_data, video_data, lora_path,
                                   priority, timeout_s)
        if stream:
            return self._results.astream(built.msgs[0], return_text_in_logprobs)
        if built.warm:
            await asyncio.to_thread(self._results.run_prefixes, built)
        results = await self._results.gather(built.msgs, return_text_in_logprobs)
        return results if built.as_list else results[0]

    def abort_request(self, rid: str) -> None:
        self._inbox.put(AbortReq([rid]))

    def flush_cache(self) -> bool:
        """Empties the radix cache; False (nothing done) while requests are queued or running."""
        return self._control.flush_cache()

    def load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False) -> LoRAUpdateOutput:
        """Reads a PEFT adapter; requests name it by lora_name once this returns with success (SGLang's result:
        success, error_message, loaded_adapters). A bad name raises ValueError."""
        ref = self.builder.lora.new_ref(lora_name, lora_path, pinned)
        msg = LoadLoraCall(ref.lora_name, ref.lora_path, ref.lora_id, ref.pinned)
        try:
            self._control.ask(msg)
        finally:
            self.builder.lora.finish_load(ref, msg.answer is not None and msg.answer.success)
        return dataclasses.replace(msg.answer, loaded_adapters=self.builder.lora.loaded())

    def unload_lora_adapter(self, lora_name: str) -> LoRAUpdateOutput:
        """New requests may no longer name the adapter; returns once the requests using it have finished and it is
        dropped. An unknown name raises ValueError."""
        ref = self.builder.lora.remove(lora_name)
        msg = UnloadLoraCall(ref.lora_name, ref.lora_id)
        self._control.ask(msg)
        return dataclasses.replace(msg.answer, loaded_adapters=self.builder.lora.loaded())

    # ------------------------------------------------------------------ weights and memory (SGLang's methods)
    def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                 abort_all_requests: bool = False, weight_version: str | None = None,
                                 flush_cache: bool = True) -> tuple[bool, str]:
        """Loads a checkpoint of the same architecture in place once the requests sent before have finished
        (abort_all_requests: aborts them); (False, why) and the old weights kept when it does not fit."""
        return self._control.call(UpdateWeightFromDiskReqInput(model_path, load_format, abort_all_requests,
                                                               weight_version, flush_cache))

    def update_weights_from_tensor(self, named_tensors, load_format: str | None = None, flush_cache: bool = True,
                                   abort_all_requests: bool = False,
                                   weight_version: str | None = None) -> tuple[bool, str]:
        """named_tensors: (checkpoint name, whole tensor) pairs, any subset of the model's; each rank loads its
        slice."""
        named = [(n, t.detach().cpu() if self.server_args.tp_size > 1 else t.detach()) for n, t in named_tensors]
        return self._control.call(UpdateWeightsFromTensorReqInput(named, load_format, flush_cache,
                                                                  abort_all_requests, weight_version))

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = "weight_update_group", backend: str = "nccl") -> tuple[bool, str]:
        return self._control.call(InitWeightsUpdateGroupReqInput(master_address, master_port, rank_offset,
                                                                 world_size, group_name, backend))

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str = "weight_update_group", flush_cache: bool = True,
                                        abort_all_requests: bool = False, weight_version: str | None = None,
                                        load_format: str | None = None) -> tuple[bool, str]:
        """Receives each named tensor from the group's rank 0 (the trainer broadcasts them in this order)."""
        return self._control.call(UpdateWeightsFromDistributedReqInput(
            list(names), list(dtypes), [list(s) for s in shapes], group_name, flush_cache, abort_all_requests,
            weight_version, load_format))

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> tuple[bool, str]:
        return self._control.call(DestroyWeightsUpdateGroupReqInput(group_name))

    def release_memory_occupation(self, tags: list[str] | None = None) -> tuple[bool, str]:
        """With enable_memory_saver: frees the KV pool and moves the weights to host memory (tags: "kv_cache",
        "weights"; None: both). Requests sent while released are refused."""
        return self._control.call(ReleaseMemoryOccupationReqInput(tags))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> tuple[bool, str]:
        return self._control.call(ResumeMemoryOccupationReqInput(tags))

    def get_weight_version(self) -> str:
        return self.scheduler.weight_version

    def shutdown(self) -> None:
        """Stops the scheduler thread and lets go of the model, the KV pools and the CUDA graphs."""
        self._stopped.set()
        self._inbox.put(ShutdownReq())
        self._thread.join(timeout=30)
        if not self._thread.is_alive() and getattr(self, "runner", None) is not None:
            self.runner.release_cuda_graphs()  # before the process group goes: see release_cuda_graphs
        self._stop_ranks()
        if not self._thread.is_alive() and getattr(self, "runner", None) is not None:
            self.scheduler.grammar_queue.shutdown()
            self.scheduler.close_disaggregation()  # its bootstrap port is free again
            self.scheduler = self.runner = None
            import torch  # not at module level: `import radixlm` stays free of torch

            gc.unfreeze()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _stop_ranks(self) -> None:
        """The other ranks leave their loop with rank 0's (a stop goes to all); any still there after that is killed."""
        from radixlm.runtime.distributed.setup import shutdown_distributed

        for _name, proc, _pipe in self._rank_procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self._rank_procs = []
        if not self._thread.is_alive():
            shutdown_distributed()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
