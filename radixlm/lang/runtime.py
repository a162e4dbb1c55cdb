"""`sgl.Runtime`: starts a radixlm server in a subprocess and exposes it as a RuntimeEndpoint."""
from __future__ import annotations

import enum
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, AsyncIterator, Optional, Union

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
        elif isinstance(v, enum.Enum):
            flags += [flag, v.value]
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
        self.generate_url = self.url + "/generate"
        self.transport: Optional[httpx.AsyncBaseTransport] = None  # async_generate's (tests script it)
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

    @staticmethod
    def _body(prompt: Any, sampling_params: Optional[dict], **kwargs: Any) -> dict:
        key = "input_ids" if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) else "text"
        body = {key: prompt, "sampling_params": sampling_params or {}}
        body.update((k, v) for k, v in kwargs.items() if v is not None)
        return body

    def generate(self, prompt: Any, sampling_params: Optional[dict] = None, return_logprob: Any = False,
                 logprob_start_len: Any = None, top_logprobs_num: Any = None, **kwargs: Any) -> str:
        """/generate's answer as a JSON string, as SGLang's Runtime returns it (`json.loads(rt.generate(...))`)."""
        body = self._body(prompt, sampling_params, return_logprob=return_logprob,
                          logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num, **kwargs)
        return json.dumps(self.endpoint._generate(body))

    async def async_generate(self, prompt: Any, sampling_params: Optional[dict] = None,
                             **kwargs: Any) -> AsyncIterator[Union[str, dict]]:
        """Streams one request: yields each new piece of its text as it comes (a chunk without text as its dict),
        as SGLang's Runtime does; `add_request` is the same."""
        body = {**self._body(prompt, sampling_params, **kwargs), "stream": True}
        pos = 0
        async with httpx.AsyncClient(base_url=self.url, timeout=3 * 3600, transport=self.transport) as client:
            async with client.stream("POST", "/generate", json=body) as res:
                if res.status_code >= 400:
                    await res.aread()
                    raise RuntimeError(f"/generate answered HTTP {res.status_code}: {res.text}")
                async for line in res.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        break
                    data = json.loads(payload)
                    if "text" not in data:
                        yield data
                        continue
                    piece = data["text"][pos:]
                    pos += len(piece)
                    if piece:
                        yield piece

    add_request = async_generate

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
