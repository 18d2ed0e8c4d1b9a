"""Safe image decoding: valid images of every kind come out right, broken files say why."""

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from explain.images import ImageError, load_rgb, to_rgb8


def png_16bit_rgb(path, pixels: np.ndarray) -> None:
    """Write an (H, W, 3) uint16 array as a 16-bit RGB PNG, which Pillow cannot write."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    height, width, _ = pixels.shape
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_16_bit_grey_is_scaled_not_clipped(tmp_path):
    ramp = np.linspace(0, 65535, 64 * 16).astype(np.uint16).reshape(16, 64)
    Image.fromarray(ramp).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    rgb = np.asarray(load_rgb(tmp_path / "g16.png"))
    assert rgb.shape == (16, 64, 3) and rgb.dtype == np.uint8
    np.testing.assert_allclose(rgb[..., 0], np.round(ramp / 257.0), atol=1)
    assert (rgb[..., 0] == rgb[..., 2]).all()


def test_16_bit_rgb_png(tmp_path):
    pixels = np.zeros((4, 5, 3), np.uint16)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = 65535, 32896, 0
    png_16bit_rgb(tmp_path / "rgb16.png", pixels)
    assert np.asarray(load_rgb(tmp_path / "rgb16.png"))[0, 0].tolist() == [255, 128, 0]


def test_cmyk_jpeg(tmp_path):
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg")
    red, green, blue = np.asarray(load_rgb(tmp_path / "cmyk.jpg"))[8, 8].tolist()
    assert red > 200 and green < 60 and blue < 60


def test_transparency_is_composited_on_white(tmp_path):
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 2] = 255
    rgba[:, :2, 3] = 255  # left half opaque blue, right half fully transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    rgb = np.asarray(load_rgb(tmp_path / "rgba.png"))
    assert rgb[0, 0].tolist() == [0, 0, 255] and rgb[0, 3].tolist() == [255, 255, 255]

    palette = Image.new("P", (4, 4), 1)
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    palette.putpixel((0, 0), 0)
    palette.save(tmp_path / "palette.png", transparency=0)
    rgb = np.asarray(load_rgb(tmp_path / "palette.png"))
    assert rgb[0, 0].tolist() == [255, 255, 255] and rgb[1, 1].tolist() == [255, 0, 0]


def test_grey_and_bilevel(tmp_path):
    Image.new("L", (3, 2), 77).save(tmp_path / "grey.png")
    Image.new("1", (3, 2), 1).save(tmp_path / "bits.png")
    assert np.asarray(load_rgb(tmp_path / "grey.png"))[0, 0].tolist() == [77, 77, 77]
    assert np.asarray(load_rgb(tmp_path / "bits.png"))[0, 0].tolist() == [255, 255, 255]


def test_exif_rotation_is_applied(tmp_path):
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :20] = (255, 0, 0)  # left half red, right half blue
    pixels[:, 20:] = (0, 0, 255)
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    image.save(tmp_path / "rotated.jpg", exif=exif, quality=95)
    upright = load_rgb(tmp_path / "rotated.jpg")
    assert upright.size == (20, 40)
    top, bottom = np.asarray(upright)[2, 10], np.asarray(upright)[37, 10]
    assert top[0] > 200 and top[2] < 60, "the left (red) side must end up on top"
    assert bottom[2] > 200 and bottom[0] < 60


def test_large_jpeg_is_decoded_at_a_reduced_size(tmp_path):
    Image.new("RGB", (2000, 1000), (10, 200, 30)).save(tmp_path / "big.jpg")
    image = load_rgb(tmp_path / "big.jpg", draft_size=300)
    assert min(image.size) >= 300 and image.size[0] < 2000
    assert load_rgb(tmp_path / "big.jpg").size == (2000, 1000)


def test_float_and_32_bit_modes():
    assert to_rgb8(Image.new("F", (1, 1), 0.5)).getpixel((0, 0)) == (128, 128, 128)
    assert to_rgb8(Image.new("I", (1, 1), 65535)).getpixel((0, 0)) == (255, 255, 255)


def test_32_bit_integer_images_are_scaled_by_their_range(tmp_path):
    # A 32-bit TIFF of 0..255 data stays as it is (it used to come out 1/257 as bright:
    # near black); 16-bit data scales from 0..65535; wider data from 0..its maximum.
    ramp = np.array([[0, 51, 255]], dtype=np.int32)
    Image.fromarray(ramp, mode="I").save(tmp_path / "eight.tif")
    with Image.open(tmp_path / "eight.tif") as image:
        assert image.mode == "I"
        assert [to_rgb8(image).getpixel((x, 0))[0] for x in range(3)] == [0, 51, 255]
    sixteen = Image.fromarray(np.array([[0, 257, 65535]], dtype=np.int32), mode="I")
    assert [to_rgb8(sixteen).getpixel((x, 0))[0] for x in range(3)] == [0, 1, 255]
    wide = Image.fromarray(np.array([[-5, 100_000, 200_000]], dtype=np.int32), mode="I")
    assert [to_rgb8(wide).getpixel((x, 0))[0] for x in range(3)] == [0, 128, 255]
    # 16-bit modes keep their type's range, whatever the data.
    assert to_rgb8(Image.new("I;16", (1, 1), 200)).getpixel((0, 0)) == (1, 1, 1)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "make", "reason"),
    [
        ("empty.jpg", lambda p: _write(p, b""), "empty file (0 bytes)"),
        ("text.jpg", lambda p: _write(p, b"hello, I am not an image\n"), "not an image: the file holds text"),
        ("noise.png", lambda p: _write(p, bytes(range(256)) * 4), "not an image, or a format Pillow cannot decode"),
        ("vector.svg", lambda p: _write(p, b"<svg xmlns='http://www.w3.org/2000/svg'/>"), "unsupported image format .svg"),
        ("photo.heic", lambda p: _write(p, b"\x00\x00\x00\x18ftypheic" + b"\x00" * 64), "unsupported image format .heic"),
        ("missing.png", lambda p: p, "file not found"),
    ],
)
def test_broken_files_give_a_reason(tmp_path, name, make, reason):
    path = make(tmp_path / name)
    with pytest.raises(ImageError) as error:
        load_rgb(path)
    assert str(error.value).startswith(reason)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_files_fail(tmp_path, fmt):
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "full", format=fmt)
    data = (tmp_path / "full").read_bytes()
    (tmp_path / "cut").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="^truncated image"):
        load_rgb(tmp_path / "cut")
    from PIL import ImageFile

    assert not ImageFile.LOAD_TRUNCATED_IMAGES


@pytest.mark.parametrize("side", [110, 150])  # above the limit (Pillow warns) and above twice it (raises)
def test_decompression_bombs_fail(tmp_path, monkeypatch, side):
    Image.new("RGB", (side, side)).save(tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    with pytest.raises(ImageError, match=f"^decompression bomb: {side * side:,} pixels, more than the limit of 10,000"):
        load_rgb(tmp_path / "bomb.png")
