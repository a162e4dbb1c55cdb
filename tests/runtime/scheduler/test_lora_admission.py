"""LoRA slots beside priority preemption, over FakeRunner (no model): a higher-priority request of the running
requests' adapter preempts as usual; one whose adapter would need a slot the running requests' adapter holds waits
(preemption never breaks the slot bound) and runs once they finish; outputs are the fake model's references."""
from __future__ import annotations

from types import SimpleNamespace

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.spec.factory import DraftFactory

from .conftest import request, run_all
from .fake_runner import FakeRunner, make_prompts, record_plans
from .fake_serving import assert_all_free, assert_reference

LOW, HIGH = 0, 100


class LoraFakeRunner(FakeRunner):
    """FakeRunner with a LoraManager's bookkeeping: the loaded adapters and what each slot holds (a pass's swaps)."""

    def __init__(self, *args, num_slots: int):
        super().__init__(*args)
        self.lora = SimpleNamespace(adapters={"x": None, "y": None}, slot_ids=[None] * num_slots)

    def forward(self, wb):
        for slot, lora_id in wb.lora.loads if wb.lora is not None else ():
            self.lora.slot_ids[slot] = lora_id
        return super().forward(wb)


def lora_scheduler() -> Scheduler:
    args = ServerArgs(model_path="fake-model", device="cpu", enable_integrity_check=True, random_seed=0,
                      max_total_tokens=1024, speculative_measure_window=0, max_running_requests=2,
                      enable_priority_scheduling=True, enable_lora=True, max_loras_per_batch=1)
    runner = LoraFakeRunner(args.max_total_tokens, args.page_size, args.max_running_requests,
                            num_slots=args.max_loras_per_batch)
    return Scheduler(args, runner, tokenizer=None, eos_token_ids=frozenset(), drafts=DraftFactory.load(args, runner))


def test_priority_preempts_within_the_lora_slots():
    sched = lora_scheduler()
    plans = record_plans(sched)
    lows = [request(f"low{i}", p, max_new_tokens=12, priority=LOW, lora_id="x")
            for i, p in enumerate(make_prompts(7, 2, lo=20, hi=30))]
    for r in lows:
        sched.add_request(r)
    for _ in range(3):
        sched.step()
    assert {r.rid for r in sched.running} == {"low0", "low1"}
    other, same = (request(n, p, max_new_tokens=6, priority=HIGH, lora_id=a)
                   for n, p, a in zip(("high_y", "high_x"), make_prompts(8, 2), ("y", "x")))
    sched.add_request(other)
    sched.step()
    assert sched.stats["preemptions"] == 0 and "high_y" not in {r.rid for r in sched.running}
    sched.add_request(same)
    sched.step()
    assert sched.stats["preemptions"] == 1 and "high_x" in {r.rid for r in sched.running}
    out = run_all(sched)
    assert_reference(out, [*lows, other, same])
    for batch in plans:  # one slot: never two adapters in a pass
        assert len({r.lora_id for r in batch.reqs} - {None}) <= 1
    assert_all_free(sched)
