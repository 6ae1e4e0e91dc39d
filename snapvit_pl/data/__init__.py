"""DataModules and transforms: labeled classification/segmentation data for evaluation, unlabeled
plain and multi-crop views for pruning."""
from .base import (
    DeferredDataLoader,
    EpochSeededSampler,
    MappedDataset,
    VisionDataModule,
    balanced_subset_indices,
    epoch_seed,
    read_image,
    seeded_rngs,
)
from .classification import ClassificationDataModule
from .fashion_mnist import (
    DEBIAN_FASHION_MNIST_DIR,
    FashionMNIST,
    FashionMNISTSegmentation,
    find_fashion_mnist,
    read_idx,
)
from .segmentation import SegmentationDataModule, SegmentationPairs
from .transforms import (
    BatchMultiCrop,
    ConvertChannels,
    MultiCropTransform,
    SegmentationTransform,
    classification_transform,
    resolve_input_config,
)
from ..errors import DataError

__all__ = [
    "BatchMultiCrop",
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
