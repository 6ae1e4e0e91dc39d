"""Reading the images of a data set: any mode to 8 bits, unreadable files named, a file's record for a
fingerprint."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
from PIL import Image

from ..io import sha256_file
from ..errors import DataError


#: Single-channel modes of more than 8 bits: 16-bit PNG / TIFF (``I;16*``) and 32-bit integers (``I``).
WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def read_image(path: str, raw: bool = False) -> Image.Image:
    """Decode an image file fully; raise DataError naming the path when it cannot be read.

    A 16-bit grayscale image is scaled to 8 bits (``L``: 0..65535 -> 0..255; converting it directly would
    saturate it); a 32-bit float image, or integers outside 0..65535, are refused. ``raw``: keep the stored
    values (class-index masks).
    """
    try:
        with Image.open(path) as image:
            image.load()
    except Image.DecompressionBombError as err:
        raise DataError(f"cannot read image {path}: {' '.join(str(err).split())} (PIL.Image.MAX_IMAGE_PIXELS); resize or "
                        "delete it, raise that limit if you trust the file, or set skip_corrupt: true to skip such "
                        "files") from err
    except (OSError, SyntaxError, ValueError) as err:
        raise DataError(f"cannot read image {path} ({err}); replace or delete the file, "
                        "or set skip_corrupt: true to skip unreadable files") from err
    return image if raw else _to_8bit(image, path)


def _to_8bit(image: Image.Image, path: str) -> Image.Image:
    """A high-bit-depth single-channel image as 8-bit ``L``, scaled by its bit depth (not clipped)."""
    low, high = image.getextrema() if image.mode in ("I", "F") else (0, 0)
    if image.mode == "F" or not 0 <= low <= high <= 65535:
        kind = "32-bit float" if image.mode == "F" else "32-bit integers beyond 16 bits"
        raise DataError(f"cannot read image {path}: mode {image.mode} ({kind}) has no fixed range to scale to 8 bits; "
                        "convert it to an 8- or 16-bit PNG, or set skip_corrupt: true to skip such files")
    if image.mode not in WIDE_MODES:
        return image
    values = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(values / 257.0), 0, 255).astype(np.uint8))


def file_record(path: str, label: int) -> list[Any]:
    """``[path, label, size, modification time (ns), sha256]`` of one file
    (:meth:`VisionDataModule.input_fingerprint`)."""
    try:
        stat = os.stat(path)
        return [str(path), int(label), int(stat.st_size), int(stat.st_mtime_ns), sha256_file(path)]
    except OSError as err:
        raise DataError(f"cannot read {path} ({err.strerror or err}); restore the file, or set skip_corrupt: true "
                        "to skip unreadable files") from err


def is_readable(path: str) -> bool:
    """Whether read_image succeeds on path."""
    try:
        read_image(path)
    except DataError:
        return False
    return True
