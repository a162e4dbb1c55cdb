"""/v1/responses through the router: a continuation and a GET/DELETE reach the worker storing the response."""
from __future__ import annotations

import json

import httpx
import pytest

from radixlm.router.responses import ResponseOwners, SseResponseIdScanner, response_id_of_body
from tests.router.fakes import FakeFleet, Mode, run


class ResponsesFleet(FakeFleet):
    """Fake workers that each keep the responses they made, as a radixlm server's store does."""

    def __init__(self, *hosts: str) -> None:
        super().__init__(*hosts)
        self.stored: dict[str, dict[str, dict]] = {h: {} for h in hosts}
        self.made = 0

    def __call__(self, req: httpx.Request) -> httpx.Response:
        host, path = req.url.host, req.url.path
        if self.mode.get(host) is not Mode.OK or not path.startswith("/v1/responses"):
            return super().__call__(req)
        store = self.stored[host]
        if path == "/v1/responses":
            body = json.loads(req.content)
            self.received[host].append(body)
            prev = body.get("previous_response_id")
            if prev is not None and prev not in store:
                return httpx.Response(404, json={"error": {"message": f"Previous response with id '{prev}' not found."}})
            self.made += 1
            obj = {"id": f"resp_{self.made}", "object": "response", "status": "completed", "output": []}
            store[obj["id"]] = obj
            if not body.get("stream"):
                return httpx.Response(200, json=obj)

            async def events():
                yield b'event: response.created\ndata: ' + json.dumps(
                    {"type": "response.created", "response": {**obj, "status": "in_progress"}}).encode() + b"\n\n"
                yield b'event: response.completed\ndata: ' + json.dumps(
                    {"type": "response.completed", "response": obj}).encode() + b"\n\n"
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())
        rid = path.rsplit("/", 1)[1]
        if rid not in store:
            return httpx.Response(404, json={"error": {"message": "not found"}})
        if req.method == "DELETE":
            del store[rid]
            return httpx.Response(200, json={"id": rid, "object": "response", "deleted": True})
        return httpx.Response(200, json=store[rid])


def owner_of(fleet: ResponsesFleet, rid: str) -> str:
    [host] = [h for h, store in fleet.stored.items() if rid in store]
    return host


def test_continuations_go_to_the_worker_storing_the_previous_response():
    fleet = ResponsesFleet("a", "b", "c")

    async def go(c, router):
        first = (await c.post("/v1/responses", json={"input": "hi"})).json()["id"]
        async with c.stream("POST", "/v1/responses", json={"input": "hello", "stream": True}) as r:
            assert r.status_code == 200
            body = b"".join([chunk async for chunk in r.aiter_raw()])
        streamed = json.loads(body.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
        for rid in (first, streamed, first, streamed):
            r = await c.post("/v1/responses", json={"input": "and then?", "previous_response_id": rid})
            assert r.status_code == 200 and r.headers["x-radixlm-worker"] == f"http://{owner_of(fleet, rid)}:1"
        # Round robin alone would have sent some continuations to workers without the previous response.
        assert owner_of(fleet, first) != owner_of(fleet, streamed)

        fleet.mode[owner_of(fleet, first)] = Mode.DOWN  # its worker gone: the others answer that they lack it
        await router.registry.check_all()
        r = await c.post("/v1/responses", json={"input": "x", "previous_response_id": first})
        assert r.status_code == 404 and "not found" in r.json()["error"]["message"]

    run(fleet, go, policy="round_robin")


def test_get_and_delete_reach_the_owner_or_any_worker_that_has_it():
    fleet = ResponsesFleet("a", "b")

    async def go(c, router):
        rid = (await c.post("/v1/responses", json={"input": "hi"})).json()["id"]
        r = await c.get(f"/v1/responses/{rid}")
        assert r.status_code == 200 and r.json()["id"] == rid
        assert r.headers["x-radixlm-worker"] == f"http://{owner_of(fleet, rid)}:1"
        # A response the router never saw (e.g. made before it restarted) is found on whichever worker has it.
        fleet.stored["b"]["resp_old"] = {"id": "resp_old", "object": "response"}
        assert (await c.get("/v1/responses/resp_old")).json()["id"] == "resp_old"

        r = await c.delete(f"/v1/responses/{rid}")
        assert r.status_code == 200 and r.json()["deleted"] is True
        r = await c.get(f"/v1/responses/{rid}")
        assert r.status_code == 404 and r.json()["error"]["message"] == f"Response with id '{rid}' not found."

    run(fleet, go, policy="round_robin")


def test_owners_keep_the_most_recently_used():
    owners = ResponseOwners(2)
    owners.record("r1", "a")
    owners.record("r2", "b")
    assert owners.owner("r1") == "a"  # r1 is now the most recent
    owners.record("r3", "c")
    assert (owners.owner("r2"), owners.owner("r1"), owners.owner("r3"), len(owners)) == (None, "a", "c", 2)
    owners.forget("r1")
    assert owners.owner("r1") is None and owners.owner(None) is None
    with pytest.raises(ValueError):
        ResponseOwners(0)


@pytest.mark.parametrize("size", [1, 2, 7, 1000])
def test_the_stream_scanner_finds_the_id_in_any_chunking(size):
    stream = (b'event: response.created\ndata: {"type": "response.created", "response": {"id": "resp_9", '
              b'"object": "response"}}\n\nevent: response.output_text.delta\ndata: {"type": '
              b'"response.output_text.delta", "delta": "response.created"}\n\n')
    scanner = SseResponseIdScanner()
    for i in range(0, len(stream), size):
        scanner.feed(stream[i:i + size])
    assert scanner.response_id == "resp_9"
    assert response_id_of_body(b'{"id": "resp_1", "object": "response"}') == "resp_1"
    assert response_id_of_body(b'{"id": "x", "object": "error"}') is None and response_id_of_body(b"{") is None
