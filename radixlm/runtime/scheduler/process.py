"""The scheduler process: owns the model, the KV pools and the Scheduler. All torch work runs on
this process's main thread. Requests come from the TokenizerManager; token outputs go to the
detokenizer; replies to control messages (flush, state) go straight back to the TokenizerManager."""
from __future__ import annotations

import logging
import signal
import sys
from dataclasses import dataclass

import zmq

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.setup import RankPlacement, init_distributed, shutdown_distributed
from radixlm.runtime.ipc import ParentWatch, PortArgs, bind_pull, connect_push, die_with_parent
from radixlm.runtime.messages import (OUTPUT_PICKLE_PROTOCOL, BatchReqOutput, BatchTokenOutput, DetokenizeInfo,
                                      SchedulerInput, SchedulerReady, TokenizedGenerateReqInput)
from radixlm.runtime.scheduler.event_loop import PROGRESS_EVERY_S, SchedulerLoop, build_scheduler
from radixlm.runtime.scheduler.fault import FatalSchedulerError

logger = logging.getLogger(__name__)


@dataclass
class ZmqInbox:
    """The scheduler's PULL socket as the loop's Inbox."""

    sock: zmq.Socket

    def recv(self, timeout_s: float) -> SchedulerInput | None:
        if timeout_s > 0 and not self.sock.poll(round(timeout_s * 1000)):
            return None
        try:
            return self.sock.recv_pyobj(zmq.NOBLOCK)
        except zmq.Again:
            return None


def run_scheduler_process(args: ServerArgs, ports: PortArgs | None, ready_pipe,
                          placement: RankPlacement | None = None) -> None:
    """One scheduler rank (the only one without tensor parallelism). Rank 0 talks to the other processes over
    ZMQ; other ranks (ports None) get rank 0's inputs through the loop and send nothing."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    rank = placement.rank if placement is not None else 0
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format=f"%(asctime)s %(levelname)s scheduler{rank or ''}: %(message)s")
    try:
        parallel, device = init_distributed(args, placement)
        built = build_scheduler(args, parallel, device)
    except BaseException as e:  # noqa: BLE001 - reported to the launcher
        ready_pipe.send(SchedulerReady(error=f"{type(e).__name__}: {e}"))
        return
    cfg, sched = built.model_config, built.scheduler
    ready_pipe.send(SchedulerReady(
        max_total_num_tokens=sched.allocator.size, max_running_requests=sched.admission.config.max_running_requests,
        vocab_size=cfg.vocab_size, context_len=cfg.context_len, model_path=cfg.model_path, architecture=cfg.architecture,
        model_type=getattr(cfg.hf_config, "model_type", ""),
        embedding_dim=built.runner.pooler.dim if built.runner.pooler is not None else 0,
        cross_encoder=built.runner.pooler is not None and built.runner.pooler.classify is not None,
        kv_cache=built.runner.kv_layout.describe(),
    ))
    if ports is None:
        loop = SchedulerLoop(sched, None, deliver=lambda _outputs: None, reply=lambda _req, _out: None,
                             keep_going=ParentWatch().parent_alive, parallel=parallel)
    else:
        loop = _rank0_loop(sched, ports, parallel)
    try:
        loop.run()
    except FatalSchedulerError:
        logger.exception("the scheduler cannot go on; exiting (the server exits too)")
        sys.exit(1)
    finally:
        built.runner.release_cuda_graphs()
        shutdown_distributed()


def _rank0_loop(sched, ports: PortArgs, parallel) -> SchedulerLoop:
    ctx = zmq.Context()
    recv = bind_pull(ctx, ports.scheduler_input)
    to_detok = connect_push(ctx, ports.detokenizer_input)
    to_tokenizer = connect_push(ctx, ports.tokenizer_input)
    new_reqs: list[DetokenizeInfo] = []

    def on_request(msg: TokenizedGenerateReqInput) -> None:
        new_reqs.append(DetokenizeInfo.from_req(msg))

    def send(outputs: BatchReqOutput) -> None:
        # NOTE: the infos go with (and before) the outputs, so the detokenizer knows every rid it sees.
        to_detok.send_pyobj(BatchTokenOutput(list(new_reqs), outputs), protocol=OUTPUT_PICKLE_PROTOCOL)
        new_reqs.clear()

    # Several deliveries within the watchdog's timeout, so that one late message cannot trip it.
    every = min(PROGRESS_EVERY_S, sched.args.watchdog_timeout / 4)
    return SchedulerLoop(sched, ZmqInbox(recv), deliver=send, reply=lambda _req, out: to_tokenizer.send_pyobj(out),
                         keep_going=ParentWatch().parent_alive, on_request=on_request, parallel=parallel,
                         progress_every_s=every)
