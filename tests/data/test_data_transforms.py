"""Input config resolution, multi-crop views, balanced subsets, YAML configuration."""
from collections import Counter

import numpy as np
import pytest
import torch
import yaml
from jsonargparse import ArgumentParser
from PIL import Image

from snapvit_pl.data import (
    ClassificationDataModule,
    DataError,
    MultiCropTransform,
    SegmentationDataModule,
    balanced_subset_indices,
    resolve_input_config,
)


def test_config_from_model_name_dict_and_overrides(tiny_vit):
    from_name = resolve_input_config(model_name="vit_small_patch16_224")
    assert from_name["input_size"] == (3, 224, 224) and from_name["mean"] == (0.5, 0.5, 0.5)
    from_dict = resolve_input_config({"input_size": (3, 64, 64), "mean": (0.1, 0.2, 0.3), "interpolation": "bilinear"})
    assert from_dict["input_size"] == (3, 64, 64) and from_dict["interpolation"] == "bilinear"
    overridden = resolve_input_config(tiny_vit, overrides={"img_size": 56, "in_chans": 3, "crop_pct": 1.0})
    assert overridden["input_size"] == (3, 56, 56) and overridden["crop_pct"] == 1.0
    gray = resolve_input_config(model_name="vit_small_patch16_224", overrides={"in_chans": 1})
    assert gray["mean"] == (0.5,) and gray["std"] == (0.5,)
    with pytest.raises(DataError, match="model_name"):
        resolve_input_config(model_name="not_a_timm_model")


@pytest.mark.parametrize("in_chans", [1, 3])
def test_multicrop_shapes_and_value_range(in_chans):
    config = {"input_size": (in_chans, 24, 24), "mean": (0.4,) * in_chans, "std": (0.2,) * in_chans,
              "interpolation": "bicubic"}
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8))
    views = MultiCropTransform(resolve_input_config(config))(image)
    assert views.shape == (12, in_chans, 24, 24) and views.dtype == torch.float32
    low, high = (0 - 0.4) / 0.2, (1 - 0.4) / 0.2
    assert views.min() >= low - 1e-5 and views.max() <= high + 1e-5
    assert views.std() > 0.5  # real image content, not a constant
    assert not torch.equal(views[0], views[1])  # independent random crops


def test_multicrop_view_counts_and_scales():
    config = resolve_input_config({"input_size": (1, 16, 16)})
    # left half black, right half white: small local crops are often all one colour; crops of
    # >= 60% of the area are wider than half the image, so they always show both colours
    array = np.zeros((64, 64), dtype=np.uint8)
    array[:, 32:] = 255
    torch.manual_seed(0)
    views = MultiCropTransform(config, n_global=3, n_local=40, global_scale=(0.6, 1.0))(Image.fromarray(array))
    assert views.shape == (43, 1, 16, 16)
    spread = views.amax(dim=(1, 2, 3)) - views.amin(dim=(1, 2, 3))
    assert (spread[:3] > 1).all() and (spread[3:] < 1e-6).any()
    with pytest.raises(DataError, match="at least one view"):
        MultiCropTransform(config, n_global=0, n_local=0)


def test_balanced_subset_indices():
    targets = [0] * 50 + [1] * 30 + [2] * 5
    picked = balanced_subset_indices(len(targets), targets, 9, seed=0)
    assert Counter(targets[i] for i in picked) == {0: 3, 1: 3, 2: 3}
    picked = balanced_subset_indices(len(targets), targets, 30, seed=0)
    assert Counter(targets[i] for i in picked) == {0: 13, 1: 12, 2: 5}
    assert picked == balanced_subset_indices(len(targets), targets, 30, seed=0)
    assert picked != balanced_subset_indices(len(targets), targets, 30, seed=1)
    assert balanced_subset_indices(10, None, None, seed=0) == list(range(10))
    kept = balanced_subset_indices(10, None, None, seed=0, keep=lambda i: i % 2 == 0)
    assert kept == [0, 2, 4, 6, 8]


def test_datamodules_build_from_yaml(classification_tree):
    parser = ArgumentParser()
    parser.add_class_arguments(ClassificationDataModule, "data")
    parser.add_class_arguments(SegmentationDataModule, "seg")
    text = yaml.safe_dump({
        "data": {"source": "folder", "root": str(classification_tree), "max_samples": 6, "num_workers": 0,
                 "data_config": {"input_size": [3, 32, 32], "crop_pct": 1.0}, "global_crop_scale": [0.5, 1.0]},
        "seg": {"source": "voc", "root": "/data/voc", "download": True},
    })
    objects = parser.instantiate(parser.parse_string(text))
    data, seg = objects.data, objects.seg
    assert isinstance(data, ClassificationDataModule) and isinstance(seg, SegmentationDataModule)
    assert data.input_config["input_size"] == (3, 32, 32) and len(data.dataset("train")) == 6
    assert seg.download and seg.num_classes == 21 and seg.ignore_index == 255


def test_batch_multicrop_views_depend_on_the_image_order_only():
    from snapvit_pl.data import BatchMultiCrop

    images = torch.randn(6, 1, 20, 20, generator=torch.Generator().manual_seed(0))
    whole = BatchMultiCrop(n_global=2, n_local=3, seed=4)(images)
    crop = BatchMultiCrop(n_global=2, n_local=3, seed=4)
    pieces = torch.cat([crop(images[:4]), crop(images[4:])])
    assert whole.shape == (6, 5, 1, 20, 20) and torch.equal(whole, pieces)
    identity = BatchMultiCrop(n_global=1, n_local=0, global_scale=(1.0, 1.0), seed=0)
    torch.testing.assert_close(identity(images)[:, 0], images)  # a crop of the whole image, resized to itself
