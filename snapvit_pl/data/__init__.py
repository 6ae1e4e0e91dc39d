"""DataModules and transforms: labeled classification/segmentation data for evaluation, unlabeled
plain and multi-crop views for pruning.

The names are imported on first use (all the DataModules at once), so that :mod:`snapvit_pl.data.layouts` (the folder-layout checks a command
line makes before it imports torch) stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "VisionDataModule": "base",
    "read_image": "images",
    **dict.fromkeys(("DeferredDataLoader", "EpochSeededSampler", "MappedDataset", "balanced_subset_indices", "epoch_seed",
                     "seeded_rngs"), "sampling"),
    "ClassificationDataModule": "classification",
    **dict.fromkeys(("DEBIAN_FASHION_MNIST_DIR", "FashionMNIST", "FashionMNISTSegmentation", "find_fashion_mnist",
                     "read_idx"), "fashion_mnist"),
    **dict.fromkeys(("SegmentationDataModule", "SegmentationPairs"), "segmentation"),
    **dict.fromkeys(("BatchMultiCrop", "ConvertChannels", "MultiCropTransform", "SegmentationTransform",
                     "classification_transform", "resolve_input_config"), "transforms"),
    "DataError": "layouts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        for module in ("classification", "segmentation"):  # every DataModule registered, as a subclass to name
            importlib.import_module(f".{module}", __name__)
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'snapvit_pl.data' has no attribute {name!r}")
