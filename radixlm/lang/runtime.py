"""`sgl.Runtime`: starts a radixlm server in a subprocess and exposes it as a RuntimeEndpoint."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Optional

import httpx

from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint
from radixlm.runtime.ipc import die_with_parent, free_port


def server_flags(kwargs: dict[str, Any]) -> list[str]:
    """ServerArgs fields as launch_server flags (checked against ServerArgs, which imports no torch)."""
    from radixlm.runtime.args import ServerArgs

    ServerArgs.from_kwargs(**kwargs)  # unknown names and bad values fail here, before a process starts
    flags: list[str] = []
    for k, v in kwargs.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            if v:
                flags.append(flag)
        elif isinstance(v, (list, tuple)):
            flags += [flag, *map(str, v)]
        elif v is not None:
            flags += [flag, str(v)]
    return flags


class Runtime:
    def __init__(self, log_level: str = "error", launch_timeout: float = 300.0, host: str = "127.0.0.1",
                 port: Optional[int] = None, **kwargs: Any) -> None:
        """kwargs are ServerArgs fields (model_path, max_total_tokens, ...)."""
        port = free_port() if port is None else port
        kwargs["log_level"] = log_level
        self.url = f"http://{host}:{port}"
        self.proc: Optional[subprocess.Popen] = None
        self.endpoint: Optional[RuntimeEndpoint] = None
        cmd = [sys.executable, "-m", "radixlm.launch_server", "--host", host, "--port", str(port),
               *server_flags(kwargs)]
        # Its own process group, so that shutdown reaches the scheduler and detokenizer children too.
        self.proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent)
        try:
            self._wait_ready(launch_timeout)
            self.endpoint = RuntimeEndpoint(self.url, api_key=kwargs.get("api_key"))
        except BaseException:
            self.shutdown()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with code {self.proc.returncode} while starting")
                try:
                    if client.get("/health_generate").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
        raise TimeoutError(f"the server at {self.url} was not ready within {timeout} s")

    def shutdown(self) -> None:
        endpoint, self.endpoint = getattr(self, "endpoint", None), None
        if endpoint is not None:
            endpoint.shutdown()
        proc, self.proc = getattr(self, "proc", None), None
        if proc is None:
            return
        if proc.poll() is None:
            # The server stops its own children on SIGTERM; the group kill below only sweeps up leftovers.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # start_new_session made the server its group's leader
        except (ProcessLookupError, PermissionError):
            pass

    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def get_tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.endpoint.model_info["tokenizer_path"])

    def generate(self, prompt: Any, sampling_params: Optional[dict] = None, **kwargs: Any) -> Any:
        key = "input_ids" if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) else "text"
        body = {key: prompt, "sampling_params": sampling_params or {}, **kwargs}
        return self.endpoint._generate(body)

    async def async_generate(self, prompt: Any, sampling_params: Optional[dict] = None, **kwargs: Any) -> Any:
        import asyncio

        return await asyncio.to_thread(self.generate, prompt, sampling_params, **kwargs)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
