"""Fashion-MNIST from gzipped IDX files (Debian's ``dataset-fashion-mnist`` package or a root
folder), and two synthetic tasks built from its real images: "Fashion-MNIST segmentation" canvases and
"cluttered Fashion-MNIST" classification canvases."""
from __future__ import annotations

import functools
import gzip
import os
from typing import Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import FashionMNIST as TorchvisionFashionMNIST

from ..errors import DataError

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = list(TorchvisionFashionMNIST.classes)
_SPLIT_PREFIX = {"train": "train", "val": "t10k"}
_IDX_DTYPES = {0x08: np.uint8}


def fashion_mnist_search_dirs(root: Optional[str]) -> list[str]:
    """Where Fashion-MNIST IDX files are looked for: the Debian package first, then the root
    (flat, or torchvision's ``FashionMNIST/raw`` layout)."""
    dirs = [DEBIAN_FASHION_MNIST_DIR]
    if root:
        dirs += [root, os.path.join(root, "FashionMNIST", "raw")]
    return dirs


def find_fashion_mnist(root: Optional[str]) -> Optional[str]:
    """First search dir holding all four IDX files (gzipped or not), else None."""
    names = [f"{prefix}-{kind}" for prefix in _SPLIT_PREFIX.values()
             for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")]
    for directory in fashion_mnist_search_dirs(root):
        if all(_idx_path(directory, name) for name in names):
            return directory
    return None


def missing_fashion_mnist_error(root: Optional[str]) -> DataError:
    """The error raised when no search dir holds the files."""
    return DataError(
        f"Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz, ...) not found in "
        f"{', '.join(fashion_mnist_search_dirs(root))}; install them with `apt-get install dataset-fashion-mnist` "
        "or set download: true (downloads into root)")


def download_fashion_mnist(root: str) -> None:
    """Download with torchvision into ``root/FashionMNIST/raw`` unless the files are already found."""
    if find_fashion_mnist(root) is None:
        TorchvisionFashionMNIST(root, train=True, download=True)


def _idx_path(directory: str, name: str) -> Optional[str]:
    for candidate in (os.path.join(directory, name + ".gz"), os.path.join(directory, name)):
        if os.path.isfile(candidate):
            return candidate
    return None


@functools.lru_cache(maxsize=4)
def read_idx(path: str) -> torch.Tensor:
    """Read an IDX file (optionally gzipped) of unsigned bytes into a uint8 tensor."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as stream:
            data = stream.read()
        zero, dtype_code, ndim = data[:2], data[2], data[3]
        if zero != b"\x00\x00" or dtype_code not in _IDX_DTYPES:
            raise ValueError(f"bad IDX header {data[:4].hex()}")
        shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
        array = np.frombuffer(data, dtype=_IDX_DTYPES[dtype_code], offset=4 + 4 * ndim).reshape(shape)
    except (OSError, ValueError, IndexError, EOFError) as err:
        raise DataError(f"cannot read IDX file {path} ({err}); reinstall dataset-fashion-mnist "
                        "or delete the file and set download: true") from err
    return torch.from_numpy(array.copy())


class FashionMNIST(Dataset):
    """Fashion-MNIST split read from IDX files; yields (PIL "L" 28x28 image, label).

    Args:
        root: extra folder to search after the Debian package location (None: package only).
        split: "train" (60000 images) or "val" (the 10000 test images).
    """

    classes = FASHION_MNIST_CLASSES

    def __init__(self, root: Optional[str] = None, split: str = "train"):
        directory = find_fashion_mnist(root)
        if directory is None:
            raise missing_fashion_mnist_error(root)
        prefix = _SPLIT_PREFIX[split]
        self.directory = directory
        #: the IDX files this split is read from (what a run's input fingerprint hashes)
        self.source_files = [_idx_path(directory, f"{prefix}-{kind}")
                             for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")]
        self.data = read_idx(self.source_files[0])
        self.targets = read_idx(self.source_files[1]).long()
        if self.data.ndim != 3 or len(self.data) != len(self.targets):
            raise DataError(f"Fashion-MNIST files in {directory} disagree ({tuple(self.data.shape)} images, "
                            f"{len(self.targets)} labels); reinstall dataset-fashion-mnist")

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.data[index].numpy()), int(self.targets[index])


class FashionMNISTSegmentation(Dataset):
    """Canvases with 1..max_items Fashion-MNIST items at seeded random positions.

    Item ``index`` is always placed first, then random others; a later item covers earlier ones
    where its own pixels are non-zero. Mask = item class + 1 on an item's non-zero pixels,
    0 = background. Sample ``index`` depends only on (seed, index).

    Args:
        items: the Fashion-MNIST split the items come from.
        canvas_size: side of the square canvas in pixels (items are 28x28).
        max_items: most items per canvas.
        seed: layout seed.
    """

    classes = ["background"] + FASHION_MNIST_CLASSES
    item_size = 28

    def __init__(self, items: FashionMNIST, canvas_size: int = 56, max_items: int = 4, seed: int = 0):
        item_size = items.data.shape[-1]
        if canvas_size < item_size or max_items < 1:
            raise DataError(f"canvas_size must be >= {item_size} and max_items >= 1, got {canvas_size}, "
                            f"{max_items}; fix canvas_size / max_items")
        self.items, self.canvas_size, self.max_items, self.seed = items, canvas_size, max_items, seed

    def __len__(self) -> int:
        return len(self.items)

    def layout(self, index: int) -> list[tuple[int, int, int]]:
        """(item index, top, left) of each item on canvas ``index``, in paint order."""
        rng = np.random.default_rng([self.seed, index])
        count = int(rng.integers(1, self.max_items + 1))
        picks = [index] + rng.integers(0, len(self.items), count - 1).tolist()
        span = self.canvas_size - self.items.data.shape[-1] + 1
        return [(int(item), int(rng.integers(span)), int(rng.integers(span))) for item in picks]

    def __getitem__(self, index: int) -> tuple[Image.Image, torch.Tensor]:
        canvas = np.zeros((self.canvas_size, self.canvas_size), dtype=np.uint8)
        mask = np.zeros((self.canvas_size, self.canvas_size), dtype=np.int64)
        for item, top, left in self.layout(index):
            pixels = self.items.data[item].numpy()
            size = pixels.shape[0]
            foreground = pixels > 0
            canvas[top:top + size, left:left + size][foreground] = pixels[foreground]
            mask[top:top + size, left:left + size][foreground] = int(self.items.targets[item]) + 1
        return Image.fromarray(canvas), torch.from_numpy(mask)


class FashionMNISTClutter(Dataset):
    """Cluttered Fashion-MNIST: one item, rescaled and placed at a random position on a larger canvas among
    fragments of other items; the label is the item's class. Yields (PIL "L" image, label).

    A harder classification task than the plain 28x28 images: the model has to find the item, at varying
    scale, and ignore the clutter, so its attention heads and MLP neurons are all needed (a linear read-out
    of the pixels no longer does well). Canvas ``index`` depends only on (seed, split, index); each
    fragment is a random square crop of another random image of the same split, painted first, and the
    item is painted over it (pixel-wise maximum).

    Args:
        items: the Fashion-MNIST split the items and fragments come from.
        split: "train" or "val" (mixed into the layout seed).
        canvas_size: side of the square canvas in pixels.
        item_sizes: smallest and largest side of the rescaled item.
        fragments: number of clutter fragments per canvas.
        fragment_sizes: smallest and largest side of a fragment.
        seed: layout seed.
    """

    classes = FASHION_MNIST_CLASSES

    def __init__(self, items: FashionMNIST, split: str = "train", canvas_size: int = 36,
                 item_sizes: tuple[int, int] = (16, 28), fragments: int = 3,
                 fragment_sizes: tuple[int, int] = (7, 11), seed: int = 0):
        low, high = item_sizes
        if not 1 <= low <= high <= canvas_size or fragments < 0 or not 1 <= fragment_sizes[0] <= fragment_sizes[1] <= 28:
            raise DataError(f"cluttered Fashion-MNIST needs 1 <= item_sizes <= canvas_size ({canvas_size}), "
                            f"fragment_sizes within 1..28 and fragments >= 0, got item_sizes={item_sizes}, "
                            f"fragment_sizes={fragment_sizes}, fragments={fragments}")
        self.items, self.split, self.canvas_size, self.seed = items, split, canvas_size, seed
        self.item_sizes, self.fragments, self.fragment_sizes = (low, high), fragments, tuple(fragment_sizes)
        self.targets = items.targets

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        rng = np.random.default_rng([self.seed, _SPLIT_CODE[self.split], index])
        canvas = np.zeros((self.canvas_size, self.canvas_size), dtype=np.uint8)
        for _ in range(self.fragments):
            source = self.items.data[int(rng.integers(len(self.items)))].numpy()
            side = int(rng.integers(self.fragment_sizes[0], self.fragment_sizes[1] + 1))
            top, left = (int(v) for v in rng.integers(0, 28 - side + 1, 2))
            _paint(canvas, source[top:top + side, left:left + side], rng)
        side = int(rng.integers(self.item_sizes[0], self.item_sizes[1] + 1))
        item = np.asarray(Image.fromarray(self.items.data[index].numpy()).resize((side, side), Image.BILINEAR))
        _paint(canvas, item, rng)
        return Image.fromarray(canvas), int(self.targets[index])


_SPLIT_CODE = {"train": 0, "val": 1}


def _paint(canvas: np.ndarray, patch: np.ndarray, rng: np.random.Generator) -> None:
    """Paint ``patch`` at a random position of ``canvas`` (pixel-wise maximum: black is transparent)."""
    top, left = (int(v) for v in rng.integers(0, canvas.shape[0] - patch.shape[0] + 1, 2))
    region = canvas[top:top + patch.shape[0], left:left + patch.shape[1]]
    np.maximum(region, patch, out=region)
