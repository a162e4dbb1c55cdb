"""A stand-in worker process for the router's failure tests (stdlib HTTP, no model): GET /health, POST /generate
(answers which port served it), GET /seen (the texts of the generate requests it got). A generate request whose
text contains POISON ends the process mid-request, as a crashing scheduler takes its worker down; one with
"hold": true is answered only once GET /release was called (requests in flight, for as long as a test needs).

    python tests/router/fake_worker.py PORT    (0 picks a free port; prints "listening on PORT" once bound)"""
from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from radixlm.runtime.ipc import die_with_parent

POISON = "<poison-pill>"
HOLD_LIMIT_S = 300.0  # a held request is answered after this anyway: nothing waits forever


class Server(ThreadingHTTPServer):
    seen: list[str]  # texts of the generate requests received (set by the handler)
    released: threading.Event  # set by GET /release: held requests are answered


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn workers do
    server: Server

    def do_GET(self) -> None:
        if self.path == "/health":
            self.answer(200, {"status": "ok"})
        elif self.path == "/seen":
            self.answer(200, {"texts": self.server.seen})
        elif self.path == "/release":
            self.server.released.set()
            self.answer(200, {"released": True})
        else:
            self.answer(404, {"object": "error", "message": "not found", "code": 404})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        text = str(body.get("text", ""))
        self.server.seen.append(text)
        if POISON in text:
            os._exit(3)  # the request is read in full: the router sees the connection close with no answer
        if body.get("hold"):
            self.server.released.wait(HOLD_LIMIT_S)
        port = self.server.server_address[1]
        self.answer(200, {"text": f"served by {port}", "meta_info": {"id": "fake", "prompt_tokens": len(text)}})

    def answer(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def main(port: int) -> None:
    die_with_parent()  # no orphan if the test process dies
    server = Server(("127.0.0.1", port), Handler)
    server.seen = []
    server.released = threading.Event()
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
