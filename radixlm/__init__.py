"""radixlm: structured LM programs and a RadixAttention inference runtime.

`import radixlm` stays light: torch and the runtime load only when Engine is first used."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Engine", "ServerArgs", "SamplingParams"]


def __getattr__(name: str):
    if name == "Engine":
        from radixlm.runtime.engine import Engine

        return Engine
    if name == "ServerArgs":
        from radixlm.runtime.args import ServerArgs

        return ServerArgs
    if name == "SamplingParams":
        from radixlm.runtime.sampling.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
