"""--disaggregation-transfer-backend mooncake / nixl: Mooncake's transfer engine (SGLang's default) and NIXL.

On the machine this was written on, `mooncake-transfer-engine-non-cuda` installs but does not import (its engine.so
links libibverbs.so.1, the RDMA user-space library, even for TCP), and `nixl` needs a CUDA build (nixl-cu12/cu13):
docs/disaggregation.md. The page-writing path over Mooncake is not written yet, so selecting it fails at start with
what is missing rather than falling back silently."""
from __future__ import annotations


def require_mooncake() -> None:
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            f"--disaggregation-transfer-backend mooncake: Mooncake's transfer engine does not import ({e}); install "
            "mooncake-transfer-engine with its RDMA libraries (libibverbs), or use the default zmq backend") from None
    raise RuntimeError("--disaggregation-transfer-backend mooncake: the transfer engine imports, but radixlm's "
                       "Mooncake page path is not written yet (docs/disaggregation.md); use the default zmq backend")


def require_nixl() -> None:
    try:
        import nixl  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"--disaggregation-transfer-backend nixl: NIXL does not import ({e}); it needs a CUDA build "
                           "(nixl-cu12 / nixl-cu13); use the default zmq backend") from None
    raise RuntimeError("--disaggregation-transfer-backend nixl: NIXL imports, but radixlm's NIXL page path is not "
                       "written yet (docs/disaggregation.md); use the default zmq backend")
