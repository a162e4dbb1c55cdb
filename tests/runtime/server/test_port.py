"""`radixlm serve` binds its HTTP port before it starts its children (http_app.listen_socket): no port a child takes
(a tensor-parallel rendezvous, gloo's connections) can be it, and a port already in use is refused at once, before
the model loads, with the address in the message."""
from __future__ import annotations

import socket
import subprocess
import sys

from tests.runtime.server.conftest import STARTUP_TIMEOUT_S


def test_a_port_in_use_is_refused_before_the_model_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # A model path that does not exist: were the port checked after loading, the error would be the model's.
        proc = subprocess.run([sys.executable, "-m", "radixlm.launch_server", "--port", str(port),
                               "--model-path", str(tmp_path / "no-model")],
                              capture_output=True, text=True, timeout=STARTUP_TIMEOUT_S)
    assert proc.returncode != 0
    assert f"cannot bind 127.0.0.1:{port}" in proc.stderr, proc.stderr[-3000:]
