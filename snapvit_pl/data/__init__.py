"""DataModules and transforms: labeled classification/segmentation data for evaluation, unlabeled
plain and multi-crop views for pruning."""
from snapvit_pl.data.base import (
    DeferredDataLoader,
    EpochSeededSampler,
    MappedDataset,
    VisionDataModule,
    balanced_subset_indices,
    epoch_seed,
    read_image,
    seeded_rngs,
)
from snapvit_pl.data.classification import ClassificationDataModule
from snapvit_pl.data.fashion_mnist import (
    DEBIAN_FASHION_MNIST_DIR,
    FashionMNIST,
    FashionMNISTSegmentation,
    find_fashion_mnist,
    read_idx,
)
from snapvit_pl.data.segmentation import SegmentationDataModule, SegmentationPairs
from snapvit_pl.data.transforms import (
    ConvertChannels,
    MultiCropTransform,
    SegmentationTransform,
    classification_transform,
    resolve_input_config,
)
from snapvit_pl.errors import DataError

__all__ = [
    "ClassificationDataModule",
    "ConvertChannels",
    "DEBIAN_FASHION_MNIST_DIR",
    "DataError",
    "DeferredDataLoader",
    "EpochSeededSampler",
    "FashionMNIST",
    "FashionMNISTSegmentation",
    "MappedDataset",
    "MultiCropTransform",
    "SegmentationDataModule",
    "SegmentationPairs",
    "SegmentationTransform",
    "VisionDataModule",
    "balanced_subset_indices",
    "classification_transform",
    "epoch_seed",
    "find_fashion_mnist",
    "read_idx",
    "read_image",
    "resolve_input_config",
    "seeded_rngs",
]
