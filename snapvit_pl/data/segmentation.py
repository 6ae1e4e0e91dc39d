"""Labeled segmentation data: ADE20K, Pascal VOC 2012, image/mask folders, Fashion-MNIST canvases."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Callable, Literal, Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import VOCSegmentation
from torchvision.datasets.folder import IMG_EXTENSIONS

from .base import VisionDataModule
from .images import read_image
from .fashion_mnist import FashionMNIST, FashionMNISTSegmentation, download_fashion_mnist
from .transforms import SegmentationTransform
from ..errors import DataError

ADE20K_LAYOUT = ("root/ADEChallengeData2016/images/{training,validation}/*.jpg with masks in "
                 "annotations/{training,validation}/*.png; download "
                 "http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip and unzip it into root")
VOC_LAYOUT = ("root/VOCdevkit/VOC2012/ with JPEGImages/, SegmentationClass/ and "
              "ImageSets/Segmentation/{train,val}.txt; set download: true to fetch it into root")
FOLDER_LAYOUT = ("root/{train,val}/images/<name>.<ext> with masks root/{train,val}/masks/<name>.png "
                 "(single-channel class indices)")
_MASK_MODES = ("L", "P", "I", "I;16")


def _first_dir(candidates: Sequence[str], required: Sequence[str]) -> Optional[str]:
    return next((d for d in candidates if all(os.path.exists(os.path.join(d, r)) for r in required)), None)


def _pair(image_path: str, mask_path: str) -> tuple[str, str]:
    if not os.path.isfile(mask_path):
        raise DataError(f"image {image_path} has no mask {mask_path}; add the mask or remove the image")
    return image_path, mask_path


def _stem_pairs(image_dir: str, mask_dir: str) -> list[tuple[str, str]]:
    names = sorted(n for n in os.listdir(image_dir) if n.lower().endswith(IMG_EXTENSIONS))
    return [_pair(os.path.join(image_dir, n), os.path.join(mask_dir, os.path.splitext(n)[0] + ".png"))
            for n in names]


def ade20k_pairs(root: str, split: str) -> list[tuple[str, str]]:
    """(image, mask) paths of an ADEChallengeData2016 split ("train" or "val")."""
    folder = "training" if split == "train" else "validation"
    base = _first_dir([os.path.join(root, "ADEChallengeData2016"), root],
                      [f"images/{folder}", f"annotations/{folder}"])
    if base is None:
        raise DataError(f"ADE20K not found under {root}; expected {ADE20K_LAYOUT}")
    return _stem_pairs(os.path.join(base, "images", folder), os.path.join(base, "annotations", folder))


def voc_pairs(root: str, split: str) -> list[tuple[str, str]]:
    """(image, mask) paths of a Pascal VOC 2012 segmentation split ("train" or "val")."""
    list_file = f"ImageSets/Segmentation/{split}.txt"
    base = _first_dir([os.path.join(root, "VOCdevkit", "VOC2012"), os.path.join(root, "VOC2012"), root],
                      ["JPEGImages", "SegmentationClass", list_file])
    if base is None:
        raise DataError(f"Pascal VOC 2012 not found under {root}; expected {VOC_LAYOUT}")
    with open(os.path.join(base, list_file)) as stream:
        ids = [line.strip() for line in stream if line.strip()]
    return [_pair(os.path.join(base, "JPEGImages", f"{i}.jpg"), os.path.join(base, "SegmentationClass", f"{i}.png"))
            for i in ids]


def folder_pairs(root: str, split: str) -> list[tuple[str, str]]:
    """(image, mask) paths of ``root/<split>/images`` and ``root/<split>/masks``."""
    image_dir, mask_dir = (os.path.join(root, split, kind) for kind in ("images", "masks"))
    if not (os.path.isdir(image_dir) and os.path.isdir(mask_dir)):
        raise DataError(f"segmentation folder {root} lacks {split}/images or {split}/masks; expected {FOLDER_LAYOUT}")
    return _stem_pairs(image_dir, mask_dir)


class SegmentationPairs(Dataset):
    """(image, mask) files; yields (PIL image, int64 mask [H, W]).

    Args:
        pairs: (image path, mask path) list; masks are single-channel PNGs of class indices.
        reduce_zero_label: map raw 0 to ignore_index and shift other classes down by one
            (ADE20K's 0 = "other"); raw ignore_index values stay ignore_index.
        ignore_index: value of pixels left out of losses and metrics.
    """

    def __init__(self, pairs: Sequence[tuple[str, str]], reduce_zero_label: bool = False, ignore_index: int = 255):
        self.pairs, self.reduce_zero_label, self.ignore_index = list(pairs), reduce_zero_label, ignore_index

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[Image.Image, torch.Tensor]:
        image_path, mask_path = self.pairs[index]
        image, mask = read_image(image_path), read_image(mask_path, raw=True)
        if image.size != mask.size:
            raise DataError(f"mask {mask_path} is {mask.size[0]}x{mask.size[1]} but image {image_path} is "
                            f"{image.size[0]}x{image.size[1]}; masks must match their images' size")
        if mask.mode not in _MASK_MODES:
            raise DataError(f"mask {mask_path} has mode {mask.mode}; expected single-channel class indices "
                            "(palette or grayscale PNG)")
        labels = torch.from_numpy(np.asarray(mask).astype(np.int64))
        if self.reduce_zero_label:
            ignored = (labels == 0) | (labels == self.ignore_index)
            labels = torch.where(ignored, self.ignore_index, labels - 1)
        return image, labels


class SegmentationDataModule(VisionDataModule):
    """Image/mask pairs for segmentation evaluation and unlabeled views for pruning.

    Batches are (images [B, C, H, W], masks [B, H, W] int64) at the model input size (masks
    resized with nearest); ``ignore_index`` marks pixels to leave out of losses and metrics.

    Args:
        source: "ade20k" (150 classes; raw 0 -> ignore_index, classes 1..150 -> 0..149),
            "voc" (21 classes, 255 = ignore), "folder" (generic images/masks pairs) or
            "fashion_mnist" (canvases of Fashion-MNIST items, 11 classes, 0 = background).
        root: data folder.
        download: let prepare_data fetch VOC (torchvision) or Fashion-MNIST into root.
        num_classes: number of classes of a "folder" source.
        ignore_index: ignore value of a "folder" source (fixed to 255 for the others).
        reduce_zero_label: for a "folder" source with ADE20K-style masks (0 = ignore).
        canvas_size: Fashion-MNIST canvas side in pixels (items are 28x28). None: the model's
            input side clipped to [28, 56], so a small model sees items at their native
            resolution and a large one 56-px canvases resized to its input.
        max_items: most Fashion-MNIST items per canvas (at least 1). None: 4 on canvases of
            56 px and more, else 1 (items would mostly cover each other).
        train_augment: RandomResizedCrop(0.5-1) + horizontal flip on the train split.
        Other args: as ClassificationDataModule.
    """

    def __init__(
        self,
        source: Literal["ade20k", "voc", "folder", "fashion_mnist"] = "fashion_mnist",
        root: str = "data",
        download: bool = False,
        num_classes: Optional[int] = None,
        ignore_index: int = 255,
        reduce_zero_label: bool = False,
        canvas_size: Optional[int] = None,
        max_items: Optional[int] = None,
        **kwargs: Any,
    ):
        super().__init__(root=root, download=download, **kwargs)
        self.save_hyperparameters()
        if source not in ("ade20k", "voc", "folder", "fashion_mnist"):
            raise DataError(f"unknown segmentation source {source!r}; use ade20k, voc, folder or fashion_mnist")
        self.source, self.canvas_size, self.max_items = source, canvas_size, max_items
        self._num_classes, self.reduce_zero_label = num_classes, reduce_zero_label
        self.ignore_index = ignore_index if source == "folder" else 255

    @property
    def num_classes(self) -> int:
        """Number of classes (ignore_index excluded)."""
        fixed = {"ade20k": 150, "voc": 21, "fashion_mnist": len(FashionMNISTSegmentation.classes)}
        if self.source in fixed:
            return fixed[self.source]
        if self._num_classes is None:
            raise DataError("a 'folder' segmentation source needs num_classes; set num_classes in the data config")
        return self._num_classes

    def canvas_layout(self) -> tuple[int, int]:
        """(canvas_size, max_items) of the Fashion-MNIST canvases, defaults resolved from the model input."""
        item = FashionMNISTSegmentation.item_size
        canvas_size = self.canvas_size
        if canvas_size is None:
            canvas_size = min(2 * item, max(item, min(self.input_config["input_size"][1:])))
        max_items = self.max_items
        if max_items is None:
            max_items = 4 if canvas_size >= 2 * item else 1
        return canvas_size, max_items

    def prepare_data(self) -> None:
        """Download (rank 0 only) VOC or Fashion-MNIST when ``download`` is set."""
        if self.download and self.source == "voc":
            VOCSegmentation(self.root, year="2012", image_set="train", download=True)
        elif self.download and self.source == "fashion_mnist":
            download_fashion_mnist(self.root)

    def _build_split(self, split: str) -> Dataset:
        if self.source == "fashion_mnist":
            canvas_size, max_items = self.canvas_layout()
            return FashionMNISTSegmentation(FashionMNIST(self.root, split), canvas_size, max_items, self.seed)
        if self.source == "ade20k":
            return SegmentationPairs(ade20k_pairs(self.root, split), reduce_zero_label=True)
        if self.source == "voc":
            return SegmentationPairs(voc_pairs(self.root, split))
        return SegmentationPairs(folder_pairs(self.root, split), self.reduce_zero_label, self.ignore_index)

    def _sample_files(self, dataset: Dataset) -> Optional[Callable[[int], Sequence[str]]]:
        return (lambda index: dataset.pairs[index]) if isinstance(dataset, SegmentationPairs) else None

    def _labeled_fn(self, split: str) -> Callable:
        return SegmentationTransform(self.input_config, train_augment=self.train_augment and split == "train")

    def _plain_transform(self) -> Callable:
        return SegmentationTransform(self.input_config)
