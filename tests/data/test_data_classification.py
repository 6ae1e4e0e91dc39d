"""ClassificationDataModule on fixture trees: shapes, labels, channels, subsets, bad input, Lightning."""
import os
import pickle
import shutil
from collections import Counter

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from PIL import Image
from torch.utils.data import DistributedSampler

from snapvit_pl.data import ClassificationDataModule, DataError


def colour_class(image, classes, colours):
    """Class whose fixture colour is nearest to the image's mean colour (in [0, 1] units)."""
    rgb = (image.reshape(3, -1).mean(1) * 0.25 + 0.5) * 255  # undo RGB32 normalisation
    return min(classes, key=lambda c: np.abs(np.array(colours[c]) - rgb.numpy()).sum())


def test_folder_loads_shapes_and_labels(classification_tree, rgb32, class_colours):
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, batch_size=4)
    dm.setup("fit")
    assert dm.classes == ["cat", "dog", "fish"] and dm.num_classes == 3
    assert len(dm.base_dataset("train")) == 12 and len(dm.base_dataset("val")) == 6
    seen = 0
    for images, labels in dm.val_dataloader():
        assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.float32
        for image, label in zip(images, labels, strict=True):
            # grayscale "fish" PNGs become 3 equal channels: their blue value is on all channels
            expected = dm.classes[label]
            if expected == "fish":
                assert torch.allclose(image[0], image[2])
            else:
                assert colour_class(image, dm.classes, class_colours) == expected
            seen += 1
    assert seen == 6


def test_channels_follow_model(classification_tree, tiny_vit):
    dm = ClassificationDataModule("folder", str(classification_tree), batch_size=3)
    config = dm.configure_for_model(tiny_vit)
    assert config["input_size"] == (1, 28, 28) and len(config["mean"]) == 1
    images, _ = next(iter(dm.val_dataloader()))
    assert images.shape == (3, 1, 28, 28)
    dm_rgb = ClassificationDataModule("folder", str(classification_tree), model_name="vit_small_patch16_224",
                                      batch_size=2)
    images, _ = next(iter(dm_rgb.val_dataloader()))
    assert images.shape == (2, 3, 224, 224)


def test_val_split_from_flat_folder(classification_tree):
    flat = classification_tree / "train"
    dm = ClassificationDataModule("folder", str(flat), val_split=0.25, seed=3)
    train, val = dm.base_dataset("train"), dm.base_dataset("val")
    assert len(train) + len(val) == 12 and len(val) == 3
    assert not set(train.indices) & set(val.indices)
    same_seed = ClassificationDataModule("folder", str(flat), val_split=0.25, seed=3)
    assert same_seed.base_dataset("val").indices == val.indices


def test_max_samples_is_balanced_and_seeded(classification_tree):
    def subset(seed):
        dm = ClassificationDataModule("folder", str(classification_tree), max_samples=6, seed=seed)
        return dm.dataset("train")

    chosen = subset(0)
    labels = [chosen.dataset.targets[i] for i in chosen.indices]
    assert Counter(labels) == {0: 2, 1: 2, 2: 2}
    assert subset(0).indices == chosen.indices
    assert any(subset(s).indices != chosen.indices for s in range(1, 5))


def test_unlabeled_dataloader_views(classification_tree, rgb32):
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, n_local_views=3)
    plain = next(iter(dm.unlabeled_dataloader("plain", batch_size=5, max_samples=9)))
    assert plain.shape == (5, 3, 32, 32)
    multi = next(iter(dm.unlabeled_dataloader("multicrop", batch_size=2)))
    assert multi.shape == (2, 5, 3, 32, 32)
    assert len(dm.unlabeled_dataloader("plain", max_samples=9).dataset) == 9
    images, labels = next(iter(dm.labeled_dataloader("train", max_samples=3, batch_size=3)))
    assert images.shape == (3, 3, 32, 32) and sorted(labels.tolist()) == [0, 1, 2]
    with pytest.raises(DataError, match="multicrop"):
        dm.unlabeled_dataloader("crops")


def test_train_views_option(classification_tree, rgb32):
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, train_views="multicrop",
                                  n_local_views=1, batch_size=2)
    assert next(iter(dm.train_dataloader())).shape == (2, 3, 3, 32, 32)


def test_torchvision_source_by_name(tmp_path, rgb32):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, count in (("train", 20), ("t10k", 10)):
        images = np.arange(count * 784, dtype=np.uint32).astype(np.uint8).reshape(count, 28, 28)
        header = bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in (count, 28, 28))
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        labels = (np.arange(count) % 10).astype(np.uint8)
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + count.to_bytes(4, "big")
                                                          + labels.tobytes())
    dm = ClassificationDataModule("MNIST", str(tmp_path), data_config=rgb32, batch_size=10)
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (10, 3, 32, 32) and labels.tolist() == list(range(10))
    assert dm.num_classes == 10 and len(dm.base_dataset("train")) == 20


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_loader_settings(classification_tree, rgb32):
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, num_workers=1,
                                  pin_memory=True, batch_size=6)
    loader = dm.train_dataloader()
    assert loader.persistent_workers and loader.pin_memory and loader.num_workers == 1
    again_loader = dm.train_dataloader()
    first = [labels.tolist() for _, labels in loader]
    again = [labels.tolist() for _, labels in again_loader]
    assert first == again  # seeded shuffling
    del loader, again_loader  # shut the persistent workers down now, not in a later gc pass


def test_workers_are_at_most_the_cores_this_process_has(classification_tree, rgb32, monkeypatch):
    """A config's num_workers: 8 on a 2-core laptop: 2 workers (DataLoader warns above the cores)."""
    from snapvit_pl import device
    from snapvit_pl.data import base

    monkeypatch.setattr(base, "cpu_cores", lambda: 1)
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, num_workers=8, batch_size=6)
    loader = dm.train_dataloader()
    assert loader.num_workers == 1 and dm.num_workers == 8  # the setting as configured, the loader's as possible
    del loader
    assert 1 <= device.cpu_cores() <= (os.cpu_count() or 1)


class _Probe(pl.LightningModule):
    """Records input shapes and counts validation samples (summed over processes)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.shapes = []

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.shapes.append(tuple(images.shape[1:]))
        assert images.shape[1:] == (1, 28, 28)
        self.log("samples", float(len(labels)), reduce_fx="sum", sync_dist=True)
        if self.trainer.world_size > 1:
            assert isinstance(self.trainer.val_dataloaders.sampler, DistributedSampler)
        return torch.nn.functional.cross_entropy(self.model(images), labels)


def _trainer(**kwargs):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


def test_trainer_resolves_input_from_its_model(classification_tree, tiny_vit):
    dm = ClassificationDataModule("folder", str(classification_tree), batch_size=4)
    probe = _Probe(tiny_vit)
    _trainer(devices=1).validate(probe, datamodule=dm)
    assert probe.shapes and set(probe.shapes) == {(1, 28, 28)}


@pytest.mark.filterwarnings("ignore:.*DistributedSampler")
def test_ddp_splits_val_across_processes(classification_tree, tiny_vit):
    dm = ClassificationDataModule("folder", str(classification_tree), batch_size=2)
    results = _trainer(devices=2, strategy="ddp_fork").validate(_Probe(tiny_vit), datamodule=dm)
    assert results[0]["samples"] == 6  # 3 per process, each val image once


def test_shards_of_an_uneven_image_count_have_as_many_batches_each_image_once(classification_tree, rgb32):
    """prune.py's processes step through their batches together (Lightning exchanges a tensor at every batch): 12
    images on 5 processes (shards of 3, 3, 2, 2, 2) in batches of 2 are 2 batches on every process, each image in
    exactly one. (Before, the 3-image shards had 2 batches and the others 1: a run hung in gloo for 30 minutes.)"""
    from snapvit_pl.data.sampling import shard_batches
    from snapvit_pl.errors import ConfigError

    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, batch_size=2)
    seen = []
    for rank in range(5):
        dm.shard(rank, 5)
        loader = dm.train_dataloader()
        batches = [images.shape[0] for images, _ in loader]
        assert len(loader) == len(batches) == 2 and all(0 < size <= 2 for size in batches)
        seen += list(loader.dataset.indices)
    assert sorted(seen) == list(range(12))
    for images in range(1, 60):  # every split: the same batch count, each image once, unchanged where it was equal
        for world in range(2, 6):
            for size in range(2, 18):
                if images < world:
                    continue
                shards = [shard_batches(images, rank, world, size) for rank in range(world)]
                assert len({len(batches) for batches in shards}) == 1
                for rank, batches in enumerate(shards):
                    count = len(range(rank, images, world))
                    assert [i for batch in batches for i in batch] == list(range(count))
                    assert all(0 < len(batch) <= size for batch in batches)
                    if -(-count // size) == len(batches):  # the plain batching gave this count already
                        assert [len(batch) for batch in batches] == [len(range(count)[i:i + size])
                                                                     for i in range(0, count, size)]
    dm.batch_size = 1  # 3 batches for the 3-image shards, but only 2 images on the others: refused, one line
    with pytest.raises(ConfigError, match=r"data.batch_size 1: 12 images on 5 processes give them different numbers "
                                          r"of batches \(3 and 2\)"):
        dm.shard(0, 5)
    dm.shard(0, 4)  # 3 each: fine


def test_datamodule_and_datasets_pickle(classification_tree, rgb32):
    """ddp_spawn and spawn-started workers pickle the module and its datasets."""
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, skip_corrupt=True)
    dm.setup("fit")
    copy = pickle.loads(pickle.dumps(dm))
    assert len(copy.base_dataset("train")) == 12
    for loader in (dm.val_dataloader(), dm.unlabeled_dataloader("multicrop")):
        images = pickle.loads(pickle.dumps(loader.dataset))[0]
        assert isinstance(images[0] if isinstance(images, tuple) else images, torch.Tensor)


def test_missing_root_names_layout(tmp_path):
    with pytest.raises(DataError, match=r"does not exist; expected one of: root/train/<class>"):
        ClassificationDataModule("folder", str(tmp_path / "nowhere")).setup()


def test_wrong_layout_names_layout(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match=r"not an image folder this module reads; expected one of: root/train/<class>"):
        ClassificationDataModule("folder", str(tmp_path)).setup()
    (tmp_path / "val").mkdir()
    with pytest.raises(DataError, match=r"no class folders with images in .*expected one of: root/train/<class>"):
        ClassificationDataModule("folder", str(tmp_path)).setup()


def test_missing_torchvision_data_says_download(tmp_path):
    with pytest.raises(DataError, match=r"CIFAR10 not found under .*download: true"):
        ClassificationDataModule("cifar10", str(tmp_path)).setup()
    with pytest.raises(DataError, match="unknown data source"):
        ClassificationDataModule("no_such_set", str(tmp_path))


def test_corrupt_image_error_names_path(classification_tree, rgb32):
    bad = classification_tree / "train" / "dog" / "9.jpg"
    bad.write_bytes(b"not a jpeg")
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, batch_size=20)
    with pytest.raises(DataError, match=rf"cannot read image {bad}.*skip_corrupt: true"):
        next(iter(dm.train_dataloader()))


def test_skip_corrupt_skips_and_counts(classification_tree, rgb32):
    bad = classification_tree / "train" / "dog" / "9.jpg"
    bad.write_bytes(b"not a jpeg")
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, batch_size=20,
                                  skip_corrupt=True)
    images, labels = next(iter(dm.train_dataloader()))
    assert len(labels) == 12 and dm.skipped["train"] == [os.fspath(bad)]
    # a balanced subset passes over the bad file and still gives each class its share
    sub = ClassificationDataModule("folder", str(classification_tree), skip_corrupt=True, max_samples=12)
    chosen = sub.dataset("train")
    assert Counter(chosen.dataset.targets[i] for i in chosen.indices) == {0: 4, 1: 4, 2: 4}


def test_train_augment_args_reach_timm(tmp_path, rgb32):
    for name in ("a", "b"):
        (tmp_path / "train" / name).mkdir(parents=True)
        gradient = np.tile(np.linspace(0, 255, 32, dtype=np.uint8)[None, :, None], (32, 1, 3))  # dark left, bright right
        Image.fromarray(gradient).save(tmp_path / "train" / name / "x.png")
    shutil.copytree(tmp_path / "train", tmp_path / "val")  # (a link to train is refused: the same files twice)
    args = {"scale": (1.0, 1.0), "ratio": (1.0, 1.0), "hflip": 1.0, "color_jitter": 0.0}
    dm = ClassificationDataModule("folder", str(tmp_path), data_config=rgb32, train_augment=True, train_augment_args=args)
    augmented, plain = dm.labeled_dataset("train")[0][0], dm.labeled_dataset("val")[0][0]
    assert torch.equal(augmented, plain.flip(-1)) and not torch.equal(augmented, plain)
    with pytest.raises(DataError, match=r"unknown keys \['scal'\].*scale, ratio, hflip"):
        ClassificationDataModule("folder", str(tmp_path), train_augment_args={"scal": (0.5, 1.0)})
    with pytest.raises(DataError, match=r"unknown keys \['mean'\]"):  # set by the data config, not here
        ClassificationDataModule("folder", str(tmp_path), train_augment_args={"mean": (0.5,)})


def test_evaluation_data_of_none_is_the_whole_split_not_the_pruning_subset(classification_tree):
    from snapvit_pl.eval import EvalData, EvaluationSettings

    dm = ClassificationDataModule("folder", str(classification_tree), batch_size=4, max_samples=3)
    data = EvalData.from_datamodule(dm, EvaluationSettings(train_samples=None, val_samples=None, batch_size=4))
    assert len(data.train.dataset) == 12 and len(data.val.dataset) == 6 and data.dataset == "folder"
    data = EvalData.from_datamodule(dm, EvaluationSettings(train_samples=6, val_samples=3, batch_size=4))
    assert len(data.train.dataset) == 6 and len(data.val.dataset) == 3
