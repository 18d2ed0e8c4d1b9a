"""Reading image files safely: any file in, an 8-bit RGB PIL image or a clear reason out.

:func:`load_rgb` is what the batch CLI decodes with. Valid images of every common kind
come out as RGB the way a person would see them: EXIF rotation applied, 16-bit values
scaled to 8 bits, CMYK converted, transparency composited onto white. Files that are not
images, are cut short, or are too large to decode safely raise :class:`ImageError` with a
message fit for a manifest.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = ["IMAGE_EXTENSIONS", "ImageError", "load_rgb", "to_rgb8"]

#: Extensions of raster formats Pillow decodes; folders are scanned for these.
READABLE_EXTENSIONS = frozenset(
    {
        ".jpg",
        ".jpeg",
        ".jpe",
        ".jfif",
        ".png",
        ".apng",
        ".gif",
        ".bmp",
        ".dib",
        ".tif",
        ".tiff",
        ".webp",
        ".ppm",
        ".pgm",
        ".pbm",
        ".pnm",
        ".tga",
        ".ico",
        ".avif",
        ".jp2",
        ".j2k",
        ".qoi",
        ".psd",
        ".sgi",
        ".pcx",
        ".dds",
        ".mpo",
    }
)
#: Image formats Pillow cannot decode; folders are scanned for them too, so that they are
#: reported as unsupported rather than silently left out.
UNSUPPORTED_EXTENSIONS = frozenset(
    {
        ".heic",
        ".heif",
        ".svg",
        ".svgz",
        ".jxl",
        ".exr",
        ".hdr",
        ".raw",
        ".dng",
        ".cr2",
        ".cr3",
        ".nef",
        ".arw",
        ".orf",
        ".rw2",
        ".raf",
    }
)
IMAGE_EXTENSIONS = READABLE_EXTENSIONS | UNSUPPORTED_EXTENSIONS

# Pillow plugins allowed to open a file. Leaving out EPS/PDF keeps Ghostscript and other
# document decoders away from untrusted files.
_WANTED_FORMATS = (
    "JPEG",
    "PNG",
    "GIF",
    "BMP",
    "DIB",
    "TIFF",
    "WEBP",
    "PPM",
    "TGA",
    "ICO",
    "AVIF",
    "JPEG2000",
    "QOI",
    "PSD",
    "SGI",
    "PCX",
    "DDS",
    "MPO",
)
_formats: list[str] = []


def _readable_formats() -> list[str]:
    if not _formats:
        Image.init()  # registers every plugin, so that the names below can be checked
        _formats.extend(name for name in _WANTED_FORMATS if name in Image.OPEN)
    return _formats


class ImageError(Exception):
    """A file that cannot be used as an image; the message says why."""


def load_rgb(path: str | os.PathLike, draft_size: int | None = None) -> Image.Image:
    """Decode ``path`` into an 8-bit RGB image, upright according to its EXIF orientation.

    ``draft_size`` lets JPEG decoding shrink large photos by 2, 4 or 8 on the fly (much
    faster) while keeping both sides at least that many pixels.

    Decompression bombs (more pixels than ``PIL.Image.MAX_IMAGE_PIXELS``) are refused, both
    above the limit, where Pillow only warns, and above twice the limit, where it raises.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ImageError("file not found") from None
    except OSError as error:
        raise ImageError(f"cannot read file: {error.strerror or error}") from None
    if not path.is_file():
        raise ImageError("not a regular file")
    if size == 0:
        raise ImageError("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=_readable_formats()) as image:
                if draft_size and image.format == "JPEG":
                    image.draft(None, (draft_size, draft_size))
                image.load()
                rgb = to_rgb8(_upright(image))
                # Closing `image` frees its pixels, so never hand it out itself.
                return rgb.copy() if rgb is image else rgb
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as error:
        pixels = re.search(r"\((\d+) pixels\)", str(error))
        found = f"{int(pixels.group(1)):,} pixels" if pixels else "too many pixels"
        raise ImageError(
            f"decompression bomb: {found}, more than the limit of {Image.MAX_IMAGE_PIXELS:,} "
            "(--max-pixels raises it for files you trust)"
        ) from None
    except UnidentifiedImageError:
        raise ImageError(_unidentified_reason(path)) from None
    except PermissionError:
        raise ImageError("permission denied: this user cannot read the file") from None
    except FileNotFoundError:
        raise ImageError("file not found (removed after it was listed?)") from None
    except OSError as error:
        message = str(error)
        if error.errno is not None and error.strerror:  # the system's error, not Pillow's
            raise ImageError(f"cannot read the file: {error.strerror.lower()}") from None
        if "truncated" in message:
            raise ImageError(f"truncated image: {message}") from None
        raise ImageError(f"corrupt image data ({message or type(error).__name__})") from None
    except (SyntaxError, ValueError, TypeError, IndexError, KeyError, EOFError, MemoryError) as error:
        # Pillow's decoders raise these for malformed headers and chunks.
        raise ImageError(f"corrupt image data ({type(error).__name__}: {error})") from None


def _upright(image: Image.Image) -> Image.Image:
    try:
        return ImageOps.exif_transpose(image)
    except Exception:  # a malformed EXIF block is no reason to drop the pixels
        return image


def _unidentified_reason(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in UNSUPPORTED_EXTENSIONS:
        return f"unsupported image format {suffix}: Pillow cannot decode it; convert it to PNG or JPEG"
    with open(path, "rb") as file:
        head = file.read(512)
    if _looks_like_text(head):
        return "not an image: the file holds text"
    return "not an image, or a format Pillow cannot decode (cannot identify image file)"


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        # A multi-byte character cut at the end of the sample is still text.
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return False
    return all(ch.isprintable() or ch in "\t\r\n\f" for ch in text)


def to_rgb8(image: Image.Image) -> Image.Image:
    """Convert a decoded image of any mode to 8-bit RGB.

    16-bit grey ("I;16" and its byte orders) is scaled from 0..65535 to 0..255, since
    Pillow's own conversion clips it. 32-bit integer grey ("I") carries no range of its
    own (Pillow also decodes 8- and 16-bit data into it), so the data's range decides: the
    smallest of 0..255, 0..65535 and 0..its maximum that holds every value (negative
    values are clipped to 0). Float ("F") is read as 0..1 when its values fit, else 0..255.
    Alpha and palette transparency are composited onto white.

    >>> to_rgb8(Image.new("I;16", (1, 1), 65535)).getpixel((0, 0))
    (255, 255, 255)
    >>> to_rgb8(Image.new("I", (1, 1), 200)).getpixel((0, 0))     # 8-bit data in a 32-bit image
    (200, 200, 200)
    """
    mode = image.mode
    if mode.startswith("I"):
        values = np.clip(np.asarray(image).astype(np.float64), 0, None)
        if mode == "I":
            peak = float(values.max()) if values.size else 0.0
            top = 255.0 if peak <= 255 else 65535.0 if peak <= 65535 else peak
        else:
            top = 65535.0
        grey = np.minimum(values, top) * (255.0 / top)
        return Image.fromarray(np.round(grey).astype(np.uint8)).convert("RGB")
    if mode == "F":
        values = np.nan_to_num(np.asarray(image, dtype=np.float32))
        scale = 255.0 if values.size and values.max() <= 1.0 else 1.0
        return Image.fromarray(np.round(np.clip(values * scale, 0, 255)).astype(np.uint8)).convert("RGB")
    if mode == "RGB" and "transparency" not in image.info:
        return image
    if mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
