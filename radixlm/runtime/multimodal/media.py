"""Media sources -> bytes -> PIL images (a video: its sampled frames, decoded with PyAV), under the operator's policy:
http(s) URLs (allowed domains, a timeout, a size limit, no redirects), data URLs, raw base64, and local files only
under the allowed directory. Every refusal is a MediaError (a ValueError: the APIs answer it with a 400)."""
from __future__ import annotations

import base64
import binascii
import io
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from PIL.Image import Image

    from radixlm.runtime.args import ServerArgs

_BASE64 = re.compile(r"[A-Za-z0-9+/\s]+={0,2}")
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w-]+=[^;,]*)*)(?P<b64>;base64)?,(?P<data>.*)", re.S)


MAX_IMAGE_PIXELS = 50_000_000  # refused before decoding: a small compressed file can expand to gigabytes
MAX_VIDEO_FRAMES = 128


class MediaError(ValueError):
    """The media input is refused, unreachable or not decodable."""


@dataclass(frozen=True)
class MediaPolicy:
    allowed_local_media_path: str | None = None  # None: no local files
    allowed_media_domains: tuple[str, ...] | None = None  # None: any host
    fetch_timeout: float = 10.0
    max_bytes: int = 20 << 20

    @classmethod
    def from_args(cls, args: "ServerArgs") -> "MediaPolicy":
        domains = args.allowed_media_domains
        return cls(args.allowed_local_media_path, tuple(d.lower().strip(".") for d in domains) if domains else None,
                   args.media_fetch_timeout, args.max_media_bytes)


@dataclass
class VideoClip:
    frames: list["Image"]
    frame_interval_s: float  # the sampled frames' mean spacing in seconds: duration / frames (transformers' sampled_fps)
    indices: tuple[int, ...] = ()  # the sampled frames' positions in the decoded stream


def even_indices(total: int, count: int) -> list[int]:
    """transformers' default frame sampler (its video processors' `sample_frames` given `num_frames`): `count` frames
    at floor(i * total / count), from the first frame on; all of them when the video has no more than `count`."""
    if count >= total:
        return list(range(total))
    return [i * total // count for i in range(count)]


def temporal_patch_indices(total: int, count: int, temporal_patch_size: int) -> list[int]:
    """Qwen2-VL's video processor sampler: the count rounded to whole temporal patches (a single frame stays one),
    then spread as transformers' default sampler does. (transformers steps by total / count in float32, which now and
    then lands a frame one off, or adds a frame past the end; this takes the exact positions.)"""
    return even_indices(total, round(count / temporal_patch_size) * temporal_patch_size or count)


class MediaLoader:
    def __init__(self, policy: MediaPolicy):
        self.policy = policy

    def load_bytes(self, source: str | bytes) -> bytes:
        if isinstance(source, (bytes, bytearray)):
            return self._sized(bytes(source))
        if not isinstance(source, str) or not source:
            raise MediaError("a media item must be a URL, a data URL, base64 data or a file path (a non-empty string)")
        low = source[:16].lower()
        if low.startswith("data:"):
            return self._data_url(source)
        if low.startswith(("http://", "https://")):
            return self._fetch(source)
        if low.startswith("file://"):
            return self._local(unquote(urlparse(source).path))
        if len(source) % 4 == 0 and _BASE64.fullmatch(source):
            return self._b64(source)
        if "://" in source[:16]:
            raise MediaError(f"unsupported media URL scheme in {source[:32]!r} (use http, https, data or file)")
        return self._local(source)

    def load_image(self, source: str | bytes) -> "Image":
        from PIL import Image, UnidentifiedImageError

        data = self.load_bytes(source)
        try:
            img = Image.open(io.BytesIO(data))  # reads the header only
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
            raise MediaError(f"cannot decode the image ({len(data)} bytes): {e}") from None
        if img.width * img.height > MAX_IMAGE_PIXELS:
            raise MediaError(f"image of {img.width}x{img.height} pixels exceeds the limit of {MAX_IMAGE_PIXELS}")
        try:
            img.load()
            return img.convert("RGB")
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise MediaError(f"cannot decode the image ({len(data)} bytes): {e}") from None

    def load_video(self, source: str | bytes, num_frames: int) -> list["Image"]:
        return self.load_clip(source, num_frames).frames

    def load_clip(self, source: str | bytes, num_frames: int,
                  sample: "Callable[[int, int], list[int]]" = even_indices) -> VideoClip:
        """`num_frames` frames of the video's first video stream, at the positions `sample(total, num_frames)` picks
        (the model's processor's rule; transformers' default: evenly from the first frame; all frames of a shorter
        video); a data URL may say how many with a num_frames parameter (data:video/mp4;num_frames=16;base64,...)."""
        import av

        m = _DATA_URL.fullmatch(source) if isinstance(source, str) and source[:5].lower() == "data:" else None
        asked = re.search(r";num_frames=(\d+)", m.group("params")) if m else None
        if asked:
            num_frames = int(asked.group(1))
            if not 1 <= num_frames <= MAX_VIDEO_FRAMES:
                raise MediaError(f"num_frames must be in [1, {MAX_VIDEO_FRAMES}], got {num_frames}")
        data = self.load_bytes(source)
        try:
            with av.open(io.BytesIO(data)) as container:
                if not container.streams.video:
                    raise MediaError("the video has no video stream")
                stream = container.streams.video[0]
                width, height = stream.codec_context.width, stream.codec_context.height
                if width * height > MAX_IMAGE_PIXELS:
                    raise MediaError(f"video frames of {width}x{height} pixels exceed the limit of {MAX_IMAGE_PIXELS}")
                total = stream.frames
                if not total:  # the container does not say: count them
                    total = sum(1 for _ in container.decode(stream))
                    container.seek(0)
                if not total:
                    raise MediaError("the video has no frames")
                indices = sorted(set(sample(total, num_frames)))
                wanted, frames = set(indices), []
                for i, f in enumerate(container.decode(stream)):
                    if i in wanted:
                        frames.append(f.to_image())
                    if i >= indices[-1]:
                        break
                rate = stream.average_rate or stream.guessed_rate
                period = 1.0 / float(rate) if rate else 1.0
        except av.error.FFmpegError as e:
            raise MediaError(f"cannot decode the video ({len(data)} bytes): {e}") from None
        if not frames:
            raise MediaError("the video has no frames")
        # transformers' sampled fps: frames taken over the video's duration (Qwen2.5-VL's time positions follow it).
        return VideoClip([f.convert("RGB") for f in frames], total * period / len(frames), tuple(indices[:len(frames)]))

    # ------------------------------------------------------------------ sources
    def _sized(self, data: bytes) -> bytes:
        if len(data) > self.policy.max_bytes:
            raise MediaError(f"media item of {len(data)} bytes exceeds the limit of {self.policy.max_bytes} bytes")
        if not data:
            raise MediaError("empty media item")
        return data

    def _b64(self, text: str) -> bytes:
        if len(text) * 3 // 4 > self.policy.max_bytes + 3:
            raise MediaError(f"media item exceeds the limit of {self.policy.max_bytes} bytes")
        try:
            return self._sized(base64.b64decode("".join(text.split()), validate=True))
        except (binascii.Error, ValueError) as e:
            if isinstance(e, MediaError):
                raise
            raise MediaError(f"invalid base64 media data: {e}") from None

    def _data_url(self, url: str) -> bytes:
        m = _DATA_URL.fullmatch(url)
        if m is None:
            raise MediaError("malformed data URL (expected data:<mime>;base64,<data>)")
        if not m.group("b64"):
            return self._sized(unquote(m.group("data")).encode("latin-1", "replace"))
        return self._b64(m.group("data"))

    def _local(self, path: str) -> bytes:
        root = self.policy.allowed_local_media_path
        if root is None:
            raise MediaError("local media files are not allowed (the server was started without "
                             "--allowed-local-media-path)")
        real, real_root = os.path.realpath(path), os.path.realpath(root)
        if os.path.commonpath([real, real_root]) != real_root:
            raise MediaError(f"media file {path!r} is outside the allowed directory")
        try:
            size = os.path.getsize(real)
            if size > self.policy.max_bytes:
                raise MediaError(f"media file of {size} bytes exceeds the limit of {self.policy.max_bytes} bytes")
            with open(real, "rb") as f:
                return self._sized(f.read())
        except OSError as e:
            raise MediaError(f"cannot read media file {path!r}: {e.strerror or e}") from None

    def _host_allowed(self, host: str) -> bool:
        allowed = self.policy.allowed_media_domains
        host = host.lower().strip(".")
        return allowed is None or any(host == d or host.endswith("." + d) for d in allowed)

    def _fetch(self, url: str) -> bytes:
        import httpx

        host = urlparse(url).hostname or ""
        if not self._host_allowed(host):
            raise MediaError(f"media URL host {host!r} is not in the allowed media domains")
        limit = self.policy.max_bytes
        try:
            # No redirects: a redirect could leave the allowed domains.
            with httpx.stream("GET", url, timeout=self.policy.fetch_timeout, follow_redirects=False) as r:
                if r.status_code != 200:
                    raise MediaError(f"fetching {url} failed: HTTP {r.status_code}")
                declared = r.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > limit:
                    raise MediaError(f"media at {url} is {declared} bytes, over the limit of {limit} bytes")
                chunks, total = [], 0
                for chunk in r.iter_bytes():
                    total += len(chunk)
                    if total > limit:
                        raise MediaError(f"media at {url} exceeds the limit of {limit} bytes")
                    chunks.append(chunk)
        except httpx.TimeoutException:
            raise MediaError(f"fetching {url} timed out after {self.policy.fetch_timeout:g}s") from None
        except httpx.HTTPError as e:
            raise MediaError(f"cannot fetch {url} (network unreachable or refused): {type(e).__name__}: {e}") from None
        return self._sized(b"".join(chunks))
