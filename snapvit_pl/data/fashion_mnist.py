"""Fashion-MNIST from gzipped IDX files (Debian's ``dataset-fashion-mnist`` package or a root
folder), and the synthetic "Fashion-MNIST segmentation" canvases built from its real images."""
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
        self.data = read_idx(_idx_path(directory, f"{prefix}-images-idx3-ubyte"))
        self.targets = read_idx(_idx_path(directory, f"{prefix}-labels-idx1-ubyte")).long()
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
