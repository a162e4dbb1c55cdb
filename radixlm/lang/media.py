"""What `sgl.image` and `sgl.video` accept, as bytes for the request: a path (str or os.PathLike) or the bytes of
an encoded file; an image may also be a PIL image or a (C, H, W) uint8 tensor, which are sent as PNG (as SGLang
encodes them)."""
from __future__ import annotations

import base64
import io
import os
from typing import Any


def media_bytes(src: Any) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    if isinstance(src, (str, os.PathLike)):
        with open(src, "rb") as f:
            return f.read()
    raise TypeError(f"sgl.video takes a path or the video file's bytes, got {type(src).__name__}")


def image_bytes(src: Any) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview, str, os.PathLike)):
        return media_bytes(src)
    if type(src).__module__.startswith("torch") and hasattr(src, "permute"):
        from PIL import Image

        src = Image.fromarray(src.detach().cpu().permute(1, 2, 0).numpy())  # (C, H, W) uint8 -> (H, W, C)
    if callable(getattr(src, "save", None)):  # a PIL image
        buf = io.BytesIO()
        src.save(buf, format="PNG")
        return buf.getvalue()
    raise TypeError(f"sgl.image takes a path, the image file's bytes, a PIL image or a (C, H, W) uint8 tensor, "
                    f"got {type(src).__name__}")


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode()
