"""Epoch-seeded shuffling and per-(epoch, sample) augmentation seeds: what exact resume of train.py needs."""
import random

import numpy as np
import pytest
import torch
from PIL import Image
from pytorch_lightning.trainer.connectors.data_connector import _get_distributed_sampler
from torch.utils.data import DataLoader

from lightning_fabric.utilities.data import _set_sampler_epoch
from lightning_fabric.utilities.distributed import DistributedSamplerWrapper
from snapvit_pl.data import (
    ClassificationDataModule, EpochSeededSampler, MappedDataset, classification_transform, resolve_input_config,
)
from snapvit_pl.data.sampling import TransformImage


def _epochs(sampler, epochs):
    orders = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


def test_order_is_a_function_of_seed_and_epoch():
    a = _epochs(EpochSeededSampler(50, seed=3), [0, 1, 2])
    resumed = _epochs(EpochSeededSampler(50, seed=3), [2, 1])  # a fresh sampler (a resumed run) jumping to epoch 2
    assert resumed == [a[2], a[1]]
    assert all(sorted(order) == list(range(50)) for order in a)
    assert a[0] != a[1] != a[2]
    assert _epochs(EpochSeededSampler(50, seed=4), [0]) != a[:1]


def test_epoch_zero_is_the_old_seeded_dataloader_order():
    """Single-epoch runs (pruning) keep the order of DataLoader(shuffle=True, generator=seeded)."""
    old = list(DataLoader(range(37), batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(5)))
    assert list(EpochSeededSampler(37, seed=5)) == old


def test_order_stays_until_the_next_set_epoch():
    sampler = EpochSeededSampler(20, seed=0)
    sampler.set_epoch(3)
    assert list(sampler) == list(sampler) == _epochs(EpochSeededSampler(20, seed=0), [3])[0]


def test_loader_draws_indices_only_at_the_first_batch(classification_tree, rgb32):
    """Lightning creates the iterator before set_epoch (issue #21938); a worker iterator must not
    have drawn the epoch-0 order by then."""
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32, num_workers=1, batch_size=12)
    loader = dm.train_dataloader()
    iterator = iter(loader)
    loader.sampler.set_epoch(2)
    _, labels = next(iterator)
    loader.sampler.set_epoch(2)
    assert labels.tolist() == next(iter(loader))[1].tolist()
    loader.sampler.set_epoch(0)
    assert labels.tolist() != next(iter(loader))[1].tolist()
    del iterator, loader


def test_with_epoch_yields_epoch_keys():
    sampler = EpochSeededSampler(6, seed=1, with_epoch=True)
    sampler.set_epoch(4)
    keys = list(sampler)
    assert [e for e, _ in keys] == [4] * 6
    sampler.set_epoch(4)
    assert [i for _, i in keys] == _epochs(EpochSeededSampler(6, seed=1), [4])[0]


@pytest.mark.parametrize("with_epoch", [False, True])
def test_lightning_ddp_wraps_the_sampler_and_forwards_set_epoch(with_epoch):
    """use_distributed_sampler=True: Lightning wraps a custom sampler in DistributedSamplerWrapper,
    whose set_epoch reaches ours; every rank derives the same order, the shards partition it."""
    loader = DataLoader(range(24), sampler=EpochSeededSampler(24, seed=0, with_epoch=with_epoch), batch_size=4)

    def shards(epoch):
        out = []
        for rank in range(2):
            wrapped = _get_distributed_sampler(loader, shuffle=True, overfit_batches=0, num_replicas=2, rank=rank, seed=0)
            assert isinstance(wrapped, DistributedSamplerWrapper)
            _set_sampler_epoch(DataLoader(range(24), sampler=wrapped), epoch)  # what the fit loop calls
            assert wrapped.dataset._sampler.epoch == epoch
            out.append(list(wrapped))
        return out

    epoch0, epoch1, again1 = shards(0), shards(1), shards(1)
    for ranks in (epoch0, epoch1):
        keys = ranks[0] + ranks[1]
        indices = [k[1] if with_epoch else k for k in keys]
        assert sorted(indices) == list(range(24))  # disjoint, complete
    assert epoch1 == again1 and epoch0 != epoch1
    if with_epoch:
        assert {k[0] for k in epoch1[0] + epoch1[1]} == {1}


def _noise_images(count, seed=0):
    rng = np.random.default_rng(seed)
    return [(Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)), i % 3) for i in range(count)]


def test_augmentation_seeded_per_epoch_and_sample(rgb32):
    dataset = MappedDataset(_noise_images(4), TransformImage(
        classification_transform(resolve_input_config(rgb32), train_augment=True)), seed=0)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    a, b = dataset[(1, 2)][0], dataset[(1, 2)][0]
    assert torch.equal(a, b)
    assert not torch.equal(a, dataset[(2, 2)][0])  # new crops every epoch
    assert torch.equal(dataset[2][0], dataset[(0, 2)][0])  # a plain index is epoch 0
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])  # the global RNGs are left alone


def test_augmented_train_loader_is_reproducible_per_epoch_across_workers(tmp_path, rgb32):
    for split, count in (("train", 4), ("val", 1)):
        for label in ("a", "b"):
            (tmp_path / split / label).mkdir(parents=True)
            for i, (image, _) in enumerate(_noise_images(count, seed=10 * count + ord(label))):
                image.save(tmp_path / split / label / f"{i}.png")

    def epoch_batches(num_workers, epoch):
        dm = ClassificationDataModule("folder", str(tmp_path), data_config=rgb32, train_augment=True,
                                      batch_size=3, num_workers=num_workers)
        loader = dm.train_dataloader()
        _set_sampler_epoch(loader, epoch)
        batches = [images for images, _ in loader]
        del loader
        return torch.cat(batches)

    epoch1 = epoch_batches(0, 1)
    assert torch.equal(epoch1, epoch_batches(1, 1))  # same images whatever the worker setup
    assert not torch.equal(epoch1, epoch_batches(0, 0))


def test_unlabeled_images_stacks_a_fixed_subset_and_rejects_empty_data(tmp_path):
    from snapvit_pl.data import ClassificationDataModule
    from snapvit_pl.errors import DataError

    dm = ClassificationDataModule(source="fashion_mnist", seed=0)
    dm.configure_for_model({"input_size": (1, 28, 28), "mean": (0.5,), "std": (0.5,)})
    images = dm.unlabeled_images(max_samples=20, batch_size=8)
    assert images.shape == (20, 1, 28, 28)
    assert torch.equal(images, dm.unlabeled_images(max_samples=20, batch_size=5))
    with pytest.raises(DataError, match="empty"):
        dm.unlabeled_images(max_samples=0)
