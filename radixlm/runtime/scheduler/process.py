"""The scheduler process: owns the model, the KV pools and the Scheduler. All torch work runs on
this process's main thread. Requests come from the TokenizerManager; token outputs go to the
detokenizer; replies to control messages (flush, state) go straight back to the TokenizerManager."""
from __future__ import annotations

import gc
import logging
import signal
import sys
import time

import zmq

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.messages import (
    AbortReq, BatchTokenOutput, DetokenizeInfo, FlushCacheReq, FlushCacheReqOutput, GetInternalStateReq,
    GetInternalStateReqOutput, SchedulerReady, ShutdownReq, TokenizedGenerateReqInput,
)
from radixlm.runtime.scheduler.fault import FatalSchedulerError, StepGuard
from radixlm.runtime.ipc import ParentWatch, PortArgs, bind_pull, connect_push, die_with_parent

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 50
GRAMMAR_POLL_MS = 2  # nothing runnable, but grammars are compiling: look at them again soon


def _build(args: ServerArgs):
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer
    from radixlm.runtime.scheduler.scheduler import Scheduler

    device = args.resolved_device()
    cfg = ModelConfig.from_path(args.model_path, dtype=args.dtype, device=device, context_length=args.context_length,
                                load_format=args.load_format)
    tokenizer = get_tokenizer(args.tokenizer_path or cfg.model_path)
    runner = ModelRunner(args, cfg, device)
    return cfg, Scheduler(args, runner, tokenizer, cfg.eos_token_ids)


def internal_state(sched) -> dict:
    tc = sched.tree_cache
    return {
        "max_total_num_tokens": sched.allocator.size,
        "available_tokens": sched.allocator.available_size(),
        "evictable_tokens": tc.evictable_size(),
        "protected_tokens": tc.protected_size(),
        "evicted_tokens_total": tc.evicted_tokens_total,
        "num_running_reqs": len(sched._active_reqs()),
        "num_waiting_reqs": len(sched.waiting_queue),
        "is_idle": sched.is_idle(),
        "stats": {**sched.stats, **sched.constrained.stats},
    }


def run_scheduler_process(args: ServerArgs, ports: PortArgs, ready_pipe) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s scheduler: %(message)s")
    try:
        cfg, sched = _build(args)
    except BaseException as e:  # noqa: BLE001 - reported to the launcher
        ready_pipe.send(SchedulerReady(error=f"{type(e).__name__}: {e}"))
        return
    gc.collect()
    gc.freeze()  # the model's long-lived objects: later collections skip them (see Engine._setup)
    ctx = zmq.Context()
    recv = bind_pull(ctx, ports.scheduler_input)
    to_detok = connect_push(ctx, ports.detokenizer_input)
    to_tokenizer = connect_push(ctx, ports.tokenizer_input)
    ready_pipe.send(SchedulerReady(
        max_total_num_tokens=sched.allocator.size, max_running_requests=sched.max_running_requests,
        vocab_size=cfg.vocab_size, context_len=cfg.context_len, model_path=cfg.model_path, architecture=cfg.architecture,
        model_type=getattr(cfg.hf_config, "model_type", ""),
    ))
    new_reqs: list[DetokenizeInfo] = []

    def send(outputs) -> None:
        # NOTE: the infos go with (and before) the outputs, so the detokenizer knows every rid it sees.
        to_detok.send_pyobj(BatchTokenOutput(list(new_reqs), outputs))
        new_reqs.clear()

    sched.output_sink = send  # outputs go out while the device runs the next pass
    try:
        _serve(sched, recv, to_tokenizer, new_reqs, send)
    except FatalSchedulerError:
        logger.exception("the scheduler cannot go on; exiting (the server exits too)")
        sys.exit(1)


def _serve(sched, recv, to_tokenizer, new_reqs: list[DetokenizeInfo], send) -> None:
    watch = ParentWatch()
    guard = StepGuard(sched)
    last_check = time.monotonic()
    while True:
        if sched.is_idle() and not recv.poll(IDLE_POLL_MS):
            if not watch.parent_alive():
                return
            continue
        if sched.nothing_to_run():
            recv.poll(GRAMMAR_POLL_MS)  # only grammars compiling: wait a little for them or for new messages
        aborts: list[str] = []
        while True:
            try:
                msg = recv.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                break
            if isinstance(msg, TokenizedGenerateReqInput):
                new_reqs.append(DetokenizeInfo.from_req(msg))
                sched.add_request(msg)
            elif isinstance(msg, AbortReq):
                aborts += msg.rids
            elif isinstance(msg, FlushCacheReq):
                to_tokenizer.send_pyobj(FlushCacheReqOutput(sched.flush_cache()))
            elif isinstance(msg, GetInternalStateReq):
                to_tokenizer.send_pyobj(GetInternalStateReqOutput(internal_state(sched)))
            elif isinstance(msg, ShutdownReq):
                return
        if aborts:
            sched.abort_requests(aborts)
        if not sched.is_idle():
            outputs = guard.step()
            if outputs:
                send(outputs)
        if time.monotonic() - last_check > 1.0:
            last_check = time.monotonic()
            if not watch.parent_alive():
                return
