"""Fashion-MNIST from the Debian package: sizes, labels against the raw IDX bytes, transforms."""
import gzip
import os

import numpy as np
import pytest
import torch

import snapvit_pl.data.fashion_mnist as fashion_mnist_module
from snapvit_pl.data import ClassificationDataModule, DataError, FashionMNIST, find_fashion_mnist


def raw_bytes(directory, name):
    with gzip.open(os.path.join(directory, name + ".gz"), "rb") as stream:
        return stream.read()


@pytest.mark.parametrize("split,prefix,count,indices", [
    ("train", "train", 60000, [0, 1, 2, 12345, 59999]),
    ("val", "t10k", 10000, [0, 1, 4321, 9999]),
])
def test_sizes_labels_and_pixels_match_raw_idx(fashion_mnist_dir, split, prefix, count, indices):
    dataset = FashionMNIST(None, split)
    assert dataset.directory == fashion_mnist_dir and len(dataset) == count
    labels = raw_bytes(fashion_mnist_dir, f"{prefix}-labels-idx1-ubyte")
    images = raw_bytes(fashion_mnist_dir, f"{prefix}-images-idx3-ubyte")
    assert int.from_bytes(labels[4:8], "big") == count
    for index in indices:
        image, label = dataset[index]
        assert label == labels[8 + index]
        expected = np.frombuffer(images, np.uint8, 784, 16 + 784 * index).reshape(28, 28)
        assert image.mode == "L" and np.array_equal(np.asarray(image), expected)


def test_single_channel_28_uses_model_mean_std(fashion_mnist_dir, tiny_vit):
    dm = ClassificationDataModule("fashion_mnist", data_config={"crop_pct": 1.0, "mean": [0.3], "std": [0.4]},
                                  batch_size=4)
    dm.configure_for_model(tiny_vit)
    images, labels = next(iter(dm.val_dataloader()))
    raw = FashionMNIST(None, "val")
    assert images.shape == (4, 1, 28, 28) and dm.num_classes == 10
    expected = (raw.data[:4].float() / 255 - 0.3) / 0.4
    assert torch.allclose(images[:, 0], expected, atol=1e-5)
    assert labels.tolist() == raw.targets[:4].tolist()


def test_upsampled_rgb_for_imagenet_vits(fashion_mnist_dir):
    dm = ClassificationDataModule("fashion_mnist", model_name="vit_small_patch16_224", batch_size=2)
    images, _ = next(iter(dm.val_dataloader()))
    assert images.shape == (2, 3, 224, 224)
    assert torch.equal(images[:, 0], images[:, 1]) and torch.equal(images[:, 1], images[:, 2])


def test_balanced_1000_for_pruning(fashion_mnist_dir, tiny_vit):
    dm = ClassificationDataModule("fashion_mnist", max_samples=1000)
    dm.configure_for_model(tiny_vit)
    subset = dm.dataset("train")
    assert len(subset) == 1000
    assert set(torch.bincount(subset.dataset.targets[subset.indices]).tolist()) == {100}


def test_missing_package_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist_module, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "absent"))
    with pytest.raises(DataError, match=r"apt-get install dataset-fashion-mnist.*download: true"):
        ClassificationDataModule("fashion_mnist", root=str(tmp_path)).setup()


def test_root_is_searched_after_the_package(fashion_mnist_dir, tmp_path, monkeypatch):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in os.listdir(fashion_mnist_dir):
        if "labels" in name:
            (raw / name).symlink_to(os.path.join(fashion_mnist_dir, name))
        elif name.endswith(".gz"):
            (raw / name[:-3]).write_bytes(raw_bytes(fashion_mnist_dir, name[:-3]))  # uncompressed copy
    monkeypatch.setattr(fashion_mnist_module, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "absent"))
    dataset = FashionMNIST(str(tmp_path), "val")
    assert dataset.directory == str(raw) and len(dataset) == 10000


@pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")
def test_cluttered_canvases_hold_the_labelled_item_among_fragments():
    from snapvit_pl.data.fashion_mnist import FashionMNISTClutter

    items = FashionMNIST(None, "val")
    canvases = FashionMNISTClutter(items, "val")
    image, label = canvases[7]
    assert image.size == (36, 36) and image.mode == "L" and label == int(items.targets[7])
    again, _ = FashionMNISTClutter(FashionMNIST(None, "val"), "val")[7]
    assert np.array_equal(np.asarray(image), np.asarray(again))  # a function of (seed, split, index)
    other, _ = FashionMNISTClutter(items, "train")[7]
    assert not np.array_equal(np.asarray(image), np.asarray(other))
    plain = FashionMNISTClutter(items, "val", fragments=0, item_sizes=(28, 28), canvas_size=28)[7][0]
    assert np.array_equal(np.asarray(plain), items.data[7].numpy())  # no clutter, full size: the item itself
    assert len(canvases) == len(items) and canvases.targets is items.targets
    with pytest.raises(DataError, match="item_sizes"):
        FashionMNISTClutter(items, item_sizes=(16, 40))


@pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")
def test_the_datamodule_serves_cluttered_canvases_at_the_models_size():


    dm = ClassificationDataModule(source="fashion_mnist_clutter", max_samples=20, batch_size=10,
                                  data_config={"input_size": (1, 36, 36), "mean": (0.1686,), "std": (0.3026,)})
    images, labels = next(iter(dm.labeled_dataloader("train")))
    assert images.shape == (10, 1, 36, 36) and dm.num_classes == 10 and labels.max() < 10
