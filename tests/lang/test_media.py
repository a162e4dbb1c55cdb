"""What sgl.image accepts, as in SGLang: a path, the file's bytes, a PIL image or a (C, H, W) uint8 tensor (the last
two sent as PNG); each reaches the request as the same base64 data and the messages as an image_url part."""
import base64
import io
import pathlib

import pytest
from PIL import Image

import radixlm as sgl
from tests.lang.fake_backend import FakeBackend


def picture() -> Image.Image:
    return Image.frombytes("RGB", (3, 2), bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9, 100, 50, 25, 1, 2, 3]))


def sent_image(src) -> Image.Image:
    @sgl.function
    def prog(s, img):
        s += sgl.user(sgl.image(img) + "What is this?")

    state = prog.run(img=src, backend=FakeBackend())
    state.sync()
    (_, data), = state.stream_executor.images_
    url = state.messages()[0]["content"][0]["image_url"]["url"]
    assert url == f"data:image/png;base64,{data}"
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_pil_image_is_sent_as_png():
    got = sent_image(picture())
    assert got.format == "PNG" and got.tobytes() == picture().tobytes()


def test_chw_uint8_tensor_is_sent_as_png():
    torch = pytest.importorskip("torch")
    chw = torch.frombuffer(bytearray(picture().tobytes()), dtype=torch.uint8).reshape(2, 3, 3).permute(2, 0, 1)
    assert sent_image(chw).tobytes() == picture().tobytes()


def test_path_objects_and_bytes_are_read_as_they_are(tmp_path):
    buf = io.BytesIO()
    picture().save(buf, format="PNG")
    png = tmp_path / "x.png"
    png.write_bytes(buf.getvalue())
    for src in (str(png), pathlib.Path(png), buf.getvalue()):
        assert sent_image(src).tobytes() == picture().tobytes()


def test_anything_else_is_a_clear_error():
    @sgl.function
    def prog(s):
        s += sgl.image(12345)

    with pytest.raises(sgl.ProgramError, match="sgl.image takes"):
        prog.run(backend=FakeBackend()).sync()
