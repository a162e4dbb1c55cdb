"""The quarantine of requests that workers die of: the store (pin, deaths per fingerprint, TTL, bound), and the
proxy against fake workers (httpx.MockTransport) that die of a poison request: at most two are lost, the client
gets the quarantine error in its API's shape, and copies are refused at the router."""
from __future__ import annotations

import pytest

from radixlm.router.failures import Delivery
from radixlm.router.quarantine import QuarantineStore, Verdict, fingerprint
from tests.router.fakes import FakeFleet, run
from tests.router.test_failures import CHAT, error_of

NOT_SENT, MAYBE_READ, ANSWERED = Delivery.NOT_SENT, Delivery.MAYBE_READ, Delivery.ANSWERED
A, B, C, D = "http://a:1", "http://b:1", "http://c:1", "http://d:1"
FP = fingerprint("/generate", b'{"text": "x"}')


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_fingerprint_is_route_and_bytes():
    assert FP == fingerprint("/generate", b'{"text": "x"}')
    assert FP != fingerprint("/v1/completions", b'{"text": "x"}')
    assert FP != fingerprint("/generate", b'{"text":"x"}')


def test_after_one_death_every_attempt_goes_to_one_other_worker_and_a_second_death_quarantines():
    q = QuarantineStore(60)
    assert q.candidates(FP, [A, B, C]) == [A, B, C] and q.sent(FP, A) is False
    assert q.ended(FP, A, False, MAYBE_READ) is False
    assert q.verdict(FP) is Verdict.SUSPECT and q.candidates(FP, [A, B, C]) == [A, B, C][1:]
    assert q.sent(FP, B) is True
    assert q.candidates(FP, [A, B, C]) == [B], "a copy goes where the resend went"
    assert q.sent(FP, B) is True
    assert q.ended(FP, B, True, MAYBE_READ) is True
    assert q.verdict(FP) is Verdict.QUARANTINED and q.candidates(FP, [C, D]) == [] and q.dead(FP) == [A, B]
    assert q.ended(FP, B, True, MAYBE_READ) is False, "the same worker counts once"
    assert q.counts() == {"quarantined": 1, "suspected": 0}


def test_copies_dying_on_the_same_worker_count_once():
    q = QuarantineStore(60)
    for _ in range(3):  # three copies in flight on A when it was killed
        q.ended(FP, A, False, MAYBE_READ)
    assert q.verdict(FP) is Verdict.SUSPECT and q.dead(FP) == [A]
    assert [q.sent(FP, B) for _ in range(3)] == [True] * 3
    q.ended(FP, B, True, None)  # served: A died of something else
    assert q.verdict(FP) is Verdict.CLEAR and q.counts() == {"quarantined": 0, "suspected": 0}


def test_a_new_pin_only_once_nothing_is_in_flight_on_the_old_one():
    q = QuarantineStore(60)
    q.ended(FP, A, False, MAYBE_READ)
    q.sent(FP, B)
    assert q.candidates(FP, [C, D]) == [], "B is out of reach (ejected) while an attempt on it may still break it"
    q.ended(FP, B, True, NOT_SENT)  # B never got it
    assert q.candidates(FP, [C, D]) == [C, D]
    q.sent(FP, C)
    q.ended(FP, C, True, ANSWERED)  # C answered a 500: alive, not a second death
    assert q.verdict(FP) is Verdict.SUSPECT and q.candidates(FP, [B, C, D]) == [C]
    q.sent(FP, C)
    q.untrack(FP, C, True)  # its client went away
    assert q.candidates(FP, [B, D]) == [B, D]


def test_entries_expire_after_the_ttl_of_their_last_death():
    clock = Clock()
    q = QuarantineStore(10, clock=clock)
    q.ended(FP, A, False, MAYBE_READ)
    clock.t = 9
    q.ended(FP, B, False, MAYBE_READ)
    clock.t = 18.9
    assert q.verdict(FP) is Verdict.QUARANTINED
    clock.t = 19
    assert q.verdict(FP) is Verdict.CLEAR and q.counts() == {"quarantined": 0, "suspected": 0}
    q.ended(FP, A, False, MAYBE_READ)
    assert q.verdict(FP) is Verdict.SUSPECT and q.dead(FP) == [A]


def test_the_store_is_bounded_oldest_first():
    q = QuarantineStore(60, max_entries=2)
    fps = [fingerprint("/generate", str(i).encode()) for i in range(3)]
    for fp in fps:
        q.ended(fp, A, False, MAYBE_READ)
    assert [q.verdict(fp) for fp in fps] == [Verdict.CLEAR, Verdict.SUSPECT, Verdict.SUSPECT]
    q.ended(fps[1], B, False, MAYBE_READ)  # a new death makes an entry the newest
    q.ended(fps[0], A, False, MAYBE_READ)
    assert [q.verdict(fp) for fp in fps] == [Verdict.SUSPECT, Verdict.QUARANTINED, Verdict.CLEAR]


POISON = "<poison>"


def poisoned_fleet(*hosts: str) -> FakeFleet:
    fleet = FakeFleet(*hosts)
    fleet.poison = POISON
    return fleet


def reached(fleet: FakeFleet) -> set[str]:
    return {h for h, bodies in fleet.received.items() if any(POISON in str(b) for b in bodies)}


@pytest.mark.parametrize("path,body", [("/generate", {"text": POISON}),
                                       ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user",
                                                                                       "content": POISON}]}),
                                       ("/v1/messages", {**CHAT, "messages": [{"role": "user", "content": POISON}]})])
def test_a_poison_request_takes_two_workers_and_its_copies_are_refused(path, body):
    fleet = poisoned_fleet("a", "b", "c")

    async def go(c, router):
        r = await c.post(path, json=body)
        assert r.status_code == 502, r.text
        message, _ = error_of(path, r.json())
        assert "two workers" in message and "copies of it will be refused" in message
        lost = reached(fleet)
        assert len(lost) == 2 and all(f"http://{h}:1" in message for h in lost)
        survivor = next(h for h in "abc" if h not in lost)
        received = {h: len(b) for h, b in fleet.received.items()}
        r = await c.post(path, json=body)
        assert r.status_code == 422
        message, err_type = error_of(path, r.json())
        assert "quarantined" in message and err_type in ("BadRequestError", "invalid_request_error")
        assert {h: len(b) for h, b in fleet.received.items()} == received, "the copy reached no worker"
        r = await c.post("/generate", json={"text": "a normal request"})
        assert r.status_code == 200 and r.headers["x-radixlm-worker"] == f"http://{survivor}:1"
        assert (await c.get("/quarantine")).json()["quarantined"] == 1
        metrics = (await c.get("/metrics")).text
        for line in ('radixlm_router:quarantines_total 1.0', 'radixlm_router:quarantine_refusals_total 1.0',
                     'radixlm_router:quarantined_requests 1.0', 'radixlm_router:resends_total{kind="maybe_read"} 1.0'):
            assert line in metrics

    run(fleet, go, retry_initial_backoff_ms=1)


def test_copies_sent_after_one_death_reach_one_more_worker_at_most():
    """No resends: each copy is one attempt, and still only two workers are ever lost."""
    fleet = poisoned_fleet("a", "b", "c", "d")

    async def go(c, router):
        r = await c.post("/generate", json={"text": POISON})
        assert r.status_code == 502 and "not resent (retries are disabled)" in r.json()["message"]
        assert len(reached(fleet)) == 1
        r = await c.post("/generate", json={"text": POISON})
        assert r.status_code == 502 and "two workers" in r.json()["message"]
        assert len(reached(fleet)) == 2
        for _ in range(3):
            r = await c.post("/generate", json={"text": POISON})
            assert r.status_code == 422
        assert len(reached(fleet)) == 2
        assert sum(w["healthy"] for w in router.describe_workers()) == 2

    run(fleet, go, policy="round_robin", disable_retries=True)


def test_quarantine_expires():
    fleet = poisoned_fleet("a", "b", "c")

    async def go(c, router):
        clock = Clock()
        router.quarantine.clock = clock
        assert (await c.post("/generate", json={"text": POISON})).status_code == 502
        assert (await c.post("/generate", json={"text": POISON})).status_code == 422
        clock.t = router.args.quarantine_secs + 1
        assert (await c.get("/quarantine")).json()["quarantined"] == 0
        r = await c.post("/generate", json={"text": POISON})
        assert r.status_code == 502 and len(reached(fleet)) == 3, "forgotten: it reaches the last worker"

    run(fleet, go, retry_initial_backoff_ms=1, quarantine_secs=30)
