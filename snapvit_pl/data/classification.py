"""Labeled classification data: ImageFolder trees, torchvision data sets by name, Fashion-MNIST."""
from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch
import torchvision.datasets
from torch.utils.data import Dataset, Subset
from torchvision.datasets import ImageFolder

from .base import VisionDataModule
from .images import read_image
from .sampling import TransformImage, dataset_targets
from .fashion_mnist import FashionMNIST, FashionMNISTClutter, download_fashion_mnist
from .folders import ImageList, ImageTree, class_dirs, find_val_labels, flat_val_images, image_files, unlabeled_images
from .layouts import FOLDER_LAYOUTS, check_folder_root
from .transforms import check_augment_args, classification_transform
from ..errors import DataError
from ..ranges import OpenUnitInterval, check_arguments
_FASHION_MNIST_NAMES = ("fashion_mnist", "fashionmnist", "fashion-mnist")
_CLUTTER_NAME = "fashion_mnist_clutter"  # FashionMNISTClutter canvases of the Fashion-MNIST images


def torchvision_dataset_class(name: str) -> type:
    """A torchvision.datasets class by case-insensitive name without separators ("cifar10")."""
    key = name.replace("_", "").replace("-", "").lower()
    for attr in torchvision.datasets.__all__:
        if attr.lower() == key:
            return getattr(torchvision.datasets, attr)
    raise DataError(f"unknown data source {name!r}; use 'folder', 'fashion_mnist' or a torchvision.datasets "
                    "name such as cifar10, cifar100, mnist, svhn")


def _split_kwargs(dataset_class: type, split: str) -> dict[str, Any]:
    """torchvision's split argument: ``train=bool`` or ``split="train"/"test"`` ("val" for ImageNet)."""
    if "train" in inspect.signature(dataset_class).parameters:
        return {"train": split == "train"}
    held_out = "val" if dataset_class is torchvision.datasets.ImageNet else "test"
    return {"split": "train" if split == "train" else held_out}


class ClassificationDataModule(VisionDataModule):
    """Labeled images for evaluation and unlabeled views for pruning.

    Transforms follow the model's timm data config (``configure_for_model(model)``, the trainer's
    LightningModule at setup, ``model_name`` or ``data_config``); images are converted to the
    model's channel count. Train and val use the eval transform unless ``train_augment``.

    Args:
        source: "folder" (an image folder at root, see :mod:`snapvit_pl.data.folders` for its layouts),
            "fashion_mnist" (Debian package, then root), "fashion_mnist_clutter" (its cluttered 36x36 canvases,
            :class:`FashionMNISTClutter`) or a torchvision.datasets name ("cifar10",
            "cifar100", "mnist", "svhn", ...).
        root: data folder (image folder, or where torchvision data sets live / download to).
        download: let prepare_data download torchvision data sets and Fashion-MNIST into root.
        val_split: for a folder of class folders without train/ and val/: fraction of images held out as val.
        val_labels: ImageNet's validation label file for a flat ``root/val`` folder (``LOC_val_solution.csv``,
            or the devkit's ``ILSVRC2012_validation_ground_truth.txt`` with ``meta.mat`` beside it); default:
            looked for in root, root/val and the devkit's data folder.
        batch_size: images per batch.
        num_workers: DataLoader workers (persistent when > 0), at most the CPU cores this process may use.
        pin_memory: DataLoader pin_memory.
        seed: seed of subsets, splits, shuffling and worker seeds (None: the run's seed_everything; 0 from Python).
        max_samples: per split, a seeded class-balanced subset of this size (None: all).
        skip_corrupt: skip (and list in ``skipped``) unreadable image files instead of failing.
        train_augment: timm's training augmentation on the train split.
        train_augment_args: keyword arguments of ``timm.data.create_transform`` for that
            augmentation (scale, ratio, hflip, color_jitter, auto_augment, re_prob, ...);
            timm's ImageNet defaults where not given.
        train_views: what train_dataloader yields: "labeled" (image, label), or unlabeled
            "plain" / "multicrop" views for pruning.
        model_name: timm model name whose pretrained_cfg gives the data config.
        data_config: timm data-config overrides (input_size, in_chans, mean, std, interpolation,
            crop_pct, crop_mode).
        n_global_views: multi-crop global views (scale global_crop_scale).
        n_local_views: multi-crop local views (scale local_crop_scale).
        global_crop_scale: area range of global crops.
        local_crop_scale: area range of local crops.
        multicrop_color_jitter: colour jitter strength of multi-crop views (0: none).
        multicrop_hflip: probability of flipping each multi-crop view horizontally (0: none).
    """

    def __init__(
        self,
        source: str = "fashion_mnist",
        root: str = "data",
        download: bool = False,
        val_split: Optional[OpenUnitInterval] = None,
        val_labels: Optional[str] = None,
        train_augment_args: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ):
        super().__init__(root=root, download=download, **kwargs)
        self.save_hyperparameters()
        check_arguments(ClassificationDataModule.__init__, {"val_split": val_split}, "data.init_args")
        self.source, self.val_split, self.val_labels = source.lower(), val_split, val_labels
        self.train_augment_args = dict(train_augment_args or {})
        check_augment_args(self.train_augment_args)  # fail at construction, not at the first batch
        if self.source not in ("folder", _CLUTTER_NAME, *_FASHION_MNIST_NAMES):
            torchvision_dataset_class(self.source)  # fail fast on an unknown name

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        train = self.base_dataset("train")
        dataset = train.dataset if isinstance(train, Subset) else train
        classes = getattr(dataset, "classes", None)
        if classes is None:
            classes = [str(label) for label in sorted(set(dataset_targets(dataset)))]
        return list(classes)

    @property
    def num_classes(self) -> int:
        """Number of classes (0 for a folder of unlabeled images)."""
        return len(self.classes)

    @property
    def labeled(self) -> bool:
        """Whether the images have labels (a folder of unlabeled images has none: pruning only)."""
        train = self.base_dataset("train")
        return not (isinstance(train, ImageList) and not train.classes)

    def prepare_data(self) -> None:
        """Download (rank 0 only) when ``download`` is set; otherwise nothing."""
        if not self.download or self.source == "folder":
            return
        if self.source in (_CLUTTER_NAME, *_FASHION_MNIST_NAMES):
            download_fashion_mnist(self.root)
            return
        dataset_class = torchvision_dataset_class(self.source)
        for split in ("train", "val"):
            dataset_class(self.root, download=True, **_split_kwargs(dataset_class, split))

    def _build_split(self, split: str) -> Dataset:
        if self.source == "folder":
            return self._folder_split(split)
        if self.source in _FASHION_MNIST_NAMES:
            return FashionMNIST(self.root, split)
        if self.source == _CLUTTER_NAME:
            return FashionMNISTClutter(FashionMNIST(self.root, split), split)
        dataset_class = torchvision_dataset_class(self.source)
        try:
            return dataset_class(self.root, download=False, **_split_kwargs(dataset_class, split))
        except RuntimeError as err:
            raise DataError(f"{dataset_class.__name__} not found under {os.path.abspath(self.root)} ({err}); "
                            "set download: true to fetch it into root, or point root at an existing copy") from err

    def _folder_split(self, split: str) -> Dataset:
        root = self.root
        check_folder_root(root)
        train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
        if os.path.isdir(train_dir) and os.path.isdir(val_dir):
            if split == "train":
                return self._image_folder(train_dir)
            classes = self.base_dataset("train").classes
            if class_dirs(val_dir):  # layout 1: class folders in both splits
                dataset = self._image_folder(val_dir)
                if dataset.classes != classes:
                    raise DataError(f"class folders of {val_dir} {dataset.classes} differ from train's {classes}; "
                                    "give both splits the same class folders")
                return dataset
            if image_files(val_dir):  # layout 2: ImageNet's flat validation folder and its label file
                return flat_val_images(val_dir, classes, find_val_labels(root, self.val_labels), read_image)
            raise DataError(f"{val_dir} holds neither class folders nor images; expected one of: {FOLDER_LAYOUTS}")
        if class_dirs(root) and not {"train", "val"} & {p.name for p in class_dirs(root)}:  # layout 3
            if self.val_split is None or not 0 < self.val_split < 1:
                raise DataError(f"{root} holds class folders but no train/ and val/ folders, and val_split is "
                                f"{self.val_split}; set data.init_args.val_split (e.g. 0.1), or use one of: "
                                f"{FOLDER_LAYOUTS}")
            dataset = self._image_folder(root)
            order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(self.seed)).tolist()
            num_val = max(1, round(len(dataset) * self.val_split))
            return Subset(dataset, sorted(order[:num_val] if split == "val" else order[num_val:]))
        if image_files(root) and not class_dirs(root):  # layout 4: unlabeled images, for pruning
            return unlabeled_images(root, read_image) if split == "train" else ImageList([], [], read_image)
        raise DataError(f"{root} is not an image folder this module reads; expected one of: {FOLDER_LAYOUTS}")

    def _image_folder(self, directory: str) -> ImageFolder:
        try:
            return ImageTree(directory, read_image, missing_ok=self.skip_corrupt)
        except (FileNotFoundError, OSError) as err:
            raise DataError(f"no class folders with images in {directory} ({err}); expected one of: "
                            f"{FOLDER_LAYOUTS}") from err

    def _sample_files(self, dataset: Dataset) -> Optional[Callable[[int], Sequence[str]]]:
        if isinstance(dataset, Subset) and isinstance(dataset.dataset, ImageFolder):
            samples, indices = dataset.dataset.samples, dataset.indices
            return lambda index: [samples[indices[index]][0]]
        if isinstance(dataset, (ImageFolder, ImageList)):
            return lambda index: [dataset.samples[index][0]]
        return None

    def _labeled_fn(self, split: str) -> Callable:
        augment = self.train_augment and split == "train"
        augment_args = self.train_augment_args if augment else {}
        return TransformImage(classification_transform(self.input_config, train_augment=augment, **augment_args))

    def _plain_transform(self) -> Callable:
        return classification_transform(self.input_config)
