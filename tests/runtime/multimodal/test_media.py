"""Media sources under the operator's policy: base64, data URLs, local files only under the allowed directory, http
URLs from allowed hosts within the size limit; everything else a MediaError naming why."""
from __future__ import annotations

import base64
import http.server
import os
import threading

import pytest

from radixlm.runtime.ipc import free_port
from radixlm.runtime.multimodal.media import MediaError, MediaLoader, MediaPolicy
from tests.runtime.models.tiny_llava import png

PNG = png(0)


@pytest.fixture(scope="module")
def server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = {"/img.png": PNG, "/big": b"x" * 5000}.get(self.path)
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/img.png")
                self.end_headers()
                return
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_inline_sources():
    loader = MediaLoader(MediaPolicy())
    b64 = base64.b64encode(PNG).decode()
    assert loader.load_bytes(b64) == PNG
    assert loader.load_bytes(f"data:image/png;base64,{b64}") == PNG
    assert loader.load_bytes(PNG) == PNG
    assert loader.load_image(b64).size == (40, 34)
    with pytest.raises(MediaError, match="decode the image"):
        loader.load_image(base64.b64encode(b"definitely not an image").decode())
    with pytest.raises(MediaError, match="malformed data URL"):
        loader.load_bytes("data:image/png;base64")
    with pytest.raises(MediaError, match="scheme"):
        loader.load_bytes("ftp://example.com/a.png")
    with pytest.raises(MediaError, match="limit"):
        MediaLoader(MediaPolicy(max_bytes=100)).load_bytes(b64)


def test_huge_images_are_refused_before_decoding():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (10_000, 6_000)).save(buf, format="PNG")  # 60 megapixels in a few kilobytes
    assert len(buf.getvalue()) < 100_000
    with pytest.raises(MediaError, match="^image of 10000x6000 pixels exceeds the limit"):
        MediaLoader(MediaPolicy()).load_image(buf.getvalue())


def test_local_files_only_under_the_allowed_directory(tmp_path):
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "a.png").write_bytes(PNG)
    (tmp_path / "secret.png").write_bytes(PNG)
    os.symlink(tmp_path / "secret.png", allowed / "link.png")
    with pytest.raises(MediaError, match="not allowed"):
        MediaLoader(MediaPolicy()).load_bytes(str(allowed / "a.png"))
    loader = MediaLoader(MediaPolicy(allowed_local_media_path=str(allowed)))
    assert loader.load_bytes(str(allowed / "a.png")) == PNG
    assert loader.load_bytes(f"file://{allowed / 'a.png'}") == PNG
    for outside in (str(tmp_path / "secret.png"), str(allowed / ".." / "secret.png"), str(allowed / "link.png")):
        with pytest.raises(MediaError, match="outside the allowed directory"):
            loader.load_bytes(outside)
    with pytest.raises(MediaError, match="cannot read"):
        loader.load_bytes(str(allowed / "missing.png"))


def test_http_urls(server):
    loader = MediaLoader(MediaPolicy(max_bytes=4500, fetch_timeout=5))
    assert loader.load_bytes(f"{server}/img.png") == PNG
    with pytest.raises(MediaError, match="HTTP 404"):
        loader.load_bytes(f"{server}/nothing")
    with pytest.raises(MediaError, match="HTTP 302"):  # redirects are not followed: they could leave the allow-list
        loader.load_bytes(f"{server}/moved")
    with pytest.raises(MediaError, match="over the limit"):
        loader.load_bytes(f"{server}/big")
    with pytest.raises(MediaError, match="unreachable or refused"):
        loader.load_bytes(f"http://127.0.0.1:{free_port()}/img.png")


def test_allowed_media_domains(server):
    only = MediaLoader(MediaPolicy(allowed_media_domains=("example.com",)))
    with pytest.raises(MediaError, match="not in the allowed media domains"):
        only.load_bytes(f"{server}/img.png")
    assert only._host_allowed("cdn.example.com") and only._host_allowed("EXAMPLE.com")
    assert not only._host_allowed("badexample.com") and not only._host_allowed("example.com.evil.org")
    assert MediaLoader(MediaPolicy(allowed_media_domains=("127.0.0.1",))).load_bytes(f"{server}/img.png") == PNG
