"""The detokenizer process: turns the scheduler's token outputs into cumulative texts (UTF-8 safe,
stop strings held back while streaming and trimmed at the end) for the TokenizerManager, so that
decoding never slows down scheduling."""
from __future__ import annotations

import logging
import signal
from collections import OrderedDict

import zmq

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.detokenizer import DecodeState, batch_decoder
from radixlm.runtime.messages import (OUTPUT_PICKLE_PROTOCOL, BatchStrOutput, BatchTokenOutput, DetokenizeInfo,
                                      ShutdownReq)
from radixlm.runtime.ipc import ParentWatch, PortArgs, bind_pull, connect_push, die_with_parent

logger = logging.getLogger(__name__)

MAX_STATES = 65536
POLL_MS = 500


class DetokenizerManager:
    def __init__(self, tokenizer, max_states: int = MAX_STATES):
        self.tokenizer = tokenizer
        self.decode_batch = batch_decoder(tokenizer)
        self.max_states = max_states
        # rid -> state; oldest first, so a leak (a rid that never finishes) cannot grow it without bound.
        self.states: OrderedDict[str, DecodeState] = OrderedDict()

    def add(self, info: DetokenizeInfo) -> None:
        self.states[info.rid] = DecodeState(self.tokenizer, info)
        while len(self.states) > self.max_states:
            self.states.popitem(last=False)

    def _state(self, rid: str) -> DecodeState:
        state = self.states.get(rid)
        if state is None:  # evicted from the bounded map: decode without prompt context
            state = self.states[rid] = DecodeState(self.tokenizer, DetokenizeInfo(rid, []))
        return state

    def handle(self, batch: BatchTokenOutput) -> BatchStrOutput:
        """Every output's windows are decoded in one call per skip_special_tokens value (a step's outputs
        cost one tokenizer call, not two per request); a failed call is retried request by request, so one
        request's failure ends only that request."""
        for info in batch.new_reqs:
            self.add(info)
        outs = batch.outputs
        finished = outs.finished_reasons
        states = [self._state(rid) for rid in outs.rids]
        windows = [s.windows(ids, fr) for s, ids, fr in zip(states, outs.new_output_ids, finished)]
        decoded: list[list[str] | None] = [None] * len(windows)
        for skip in {s.info.skip_special_tokens for s in states}:
            rows = [i for i, s in enumerate(states) if s.info.skip_special_tokens == skip]
            try:
                flat = iter(self.decode_batch([w for i in rows for w in windows[i]], skip))
                for i in rows:
                    decoded[i] = [next(flat) for _ in windows[i]]
            except Exception:  # noqa: BLE001 - found out below, per request
                pass
        texts = []
        for i, (rid, state, seqs, got) in enumerate(zip(outs.rids, states, windows, decoded)):
            try:
                if got is None:
                    got = [self.tokenizer.decode(w, skip_special_tokens=state.info.skip_special_tokens) for w in seqs]
                texts.append(state.take(got, finished[i]))
            except Exception as e:  # noqa: BLE001 - one request's text must not stop the others'
                logger.exception("detokenizing request %s failed", rid)
                texts.append("")
                finished[i] = {"type": "abort", "message": f"internal error while detokenizing: "
                               f"{type(e).__name__}: {e}", "status_code": 500}
            if finished[i] is not None:
                self.states.pop(rid, None)
        return BatchStrOutput(batch.outputs, texts)


def run_detokenizer_process(args: ServerArgs, ports: PortArgs, ready_pipe) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s detokenizer: %(message)s")
    try:
        from radixlm.runtime.model_loader.tokenizer import get_tokenizer

        manager = DetokenizerManager(get_tokenizer(args.tokenizer_path or args.model_path))
    except BaseException as e:  # noqa: BLE001 - reported to the launcher
        ready_pipe.send(f"{type(e).__name__}: {e}")
        return
    ctx = zmq.Context()
    recv = bind_pull(ctx, ports.detokenizer_input)
    send = connect_push(ctx, ports.tokenizer_input)
    ready_pipe.send(None)
    watch = ParentWatch()
    while True:
        if not recv.poll(POLL_MS):
            if not watch.parent_alive():
                return
            continue
        msg = recv.recv_pyobj()
        if isinstance(msg, ShutdownReq):
            return
        send.send_pyobj(manager.handle(msg), protocol=OUTPUT_PICKLE_PROTOCOL)
