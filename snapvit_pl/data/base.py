"""Shared pieces of the DataModules: image reading, seeded balanced subsets, the base module."""
from __future__ import annotations

import itertools
import logging
import os
import random
import weakref
from abc import ABCMeta, abstractmethod
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Callable, Literal, Optional, Union

import numpy as np
import pytorch_lightning as pl
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from .folders import refuse_shared_files
from .transforms import (
    GLOBAL_CROP_SCALE, LOCAL_CROP_SCALE, N_GLOBAL_VIEWS, N_LOCAL_VIEWS, MultiCropTransform, resolve_input_config,
)
from ..device import cpu_cores
from ..io import sha256_file
from ..ranges import ClosedUnitInterval, NonNegativeInt, PositiveInt, Seed, check_arguments
from ..errors import ConfigError, DataError
from ..seeding import resolve_seed

log = logging.getLogger(__name__)

Views = Literal["plain", "multicrop"]
SPLITS = ("train", "val")


#: Single-channel modes of more than 8 bits: 16-bit PNG / TIFF (``I;16*``) and 32-bit integers (``I``).
WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def read_image(path: str, raw: bool = False) -> Image.Image:
    """Decode an image file fully; raise DataError naming the path when it cannot be read.

    A 16-bit grayscale image is scaled to 8 bits (``L``: 0..65535 -> 0..255; converting it directly would
    saturate it); a 32-bit float image, or integers outside 0..65535, are refused. ``raw``: keep the stored
    values (class-index masks).
    """
    try:
        with Image.open(path) as image:
            image.load()
    except Image.DecompressionBombError as err:
        raise DataError(f"cannot read image {path}: {' '.join(str(err).split())} (PIL.Image.MAX_IMAGE_PIXELS); resize or "
                        "delete it, raise that limit if you trust the file, or set skip_corrupt: true to skip such "
                        "files") from err
    except (OSError, SyntaxError, ValueError) as err:
        raise DataError(f"cannot read image {path} ({err}); replace or delete the file, "
                        "or set skip_corrupt: true to skip unreadable files") from err
    return image if raw else _to_8bit(image, path)


def _to_8bit(image: Image.Image, path: str) -> Image.Image:
    """A high-bit-depth single-channel image as 8-bit ``L``, scaled by its bit depth (not clipped)."""
    low, high = image.getextrema() if image.mode in ("I", "F") else (0, 0)
    if image.mode == "F" or not 0 <= low <= high <= 65535:
        kind = "32-bit float" if image.mode == "F" else "32-bit integers beyond 16 bits"
        raise DataError(f"cannot read image {path}: mode {image.mode} ({kind}) has no fixed range to scale to 8 bits; "
                        "convert it to an 8- or 16-bit PNG, or set skip_corrupt: true to skip such files")
    if image.mode not in WIDE_MODES:
        return image
    values = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(values / 257.0), 0, 255).astype(np.uint8))


def _file_record(path: str, label: int) -> list[Any]:
    """``[path, label, size, modification time (ns), sha256]`` of one file
    (:meth:`VisionDataModule.input_fingerprint`)."""
    try:
        stat = os.stat(path)
        return [str(path), int(label), int(stat.st_size), int(stat.st_mtime_ns), sha256_file(path)]
    except OSError as err:
        raise DataError(f"cannot read {path} ({err.strerror or err}); restore the file, or set skip_corrupt: true "
                        "to skip unreadable files") from err


def is_readable(path: str) -> bool:
    """Whether read_image succeeds on path."""
    try:
        read_image(path)
    except DataError:
        return False
    return True


def dataset_targets(dataset: Dataset) -> Optional[list[int]]:
    """Class labels of a dataset without loading its images (``targets``/``labels``), else None."""
    if isinstance(dataset, Subset):
        targets = dataset_targets(dataset.dataset)
        return None if targets is None else [targets[i] for i in dataset.indices]
    targets = getattr(dataset, "targets", None)
    if targets is None:
        targets = getattr(dataset, "labels", None)
    if targets is None:
        return None
    return [int(t) for t in (targets.tolist() if hasattr(targets, "tolist") else targets)]


def balanced_subset_indices(
    num_items: int,
    targets: Optional[Sequence[int]],
    max_samples: Optional[int],
    seed: int,
    keep: Optional[Callable[[int], bool]] = None,
) -> list[int]:
    """Seeded class-balanced selection: classes take turns giving a random item each.

    Args:
        num_items: dataset length.
        targets: class of each item (None: one class, i.e. a plain random subset).
        max_samples: how many to take (None: all).
        seed: seed of the per-class shuffles.
        keep: predicate; items it rejects are passed over (e.g. unreadable files).

    Returns:
        sorted indices; per-class counts differ by at most one unless a class runs out.
    """
    if keep is None and (max_samples is None or max_samples >= num_items):
        return list(range(num_items))
    generator = torch.Generator().manual_seed(seed)
    by_class: dict[int, list[int]] = defaultdict(list)
    for index in torch.randperm(num_items, generator=generator).tolist():
        by_class[targets[index] if targets is not None else 0].append(index)
    queues = [iter(by_class[label]) for label in sorted(by_class)]
    limit = num_items if max_samples is None else min(max_samples, num_items)
    chosen: list[int] = []
    while queues and len(chosen) < limit:
        for queue in list(queues):
            index = next((i for i in queue if keep is None or keep(i)), None)
            if index is None:
                queues.remove(queue)
                continue
            chosen.append(index)
            if len(chosen) == limit:
                break
    return sorted(chosen)


# Odd 64-bit stride (golden ratio) mixing the epoch into seeds; epoch 0 leaves a seed unchanged.
_EPOCH_STRIDE = 0x9E3779B97F4A7C15


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of ``epoch`` derived from ``seed`` (``seed`` itself for epoch 0), in [0, 2**64)."""
    return (int(seed) + int(epoch) * _EPOCH_STRIDE) % 2**64


@contextmanager
def seeded_rngs(seed: int):
    """Run a block under torch's CPU RNG, Python's ``random`` and NumPy's global RNG all seeded
    from ``seed``; their previous states are restored afterwards (CUDA RNGs are not touched)."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed % 2**64)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


class EpochSeededSampler(Sampler):
    """Shuffled order that is a function of ``(seed, epoch)`` only, so an interrupted and resumed
    training run sees exactly the batches of an uninterrupted one.

    Lightning calls ``set_epoch(epoch)`` before every training epoch, also on the
    ``DistributedSamplerWrapper`` it puts around this sampler under DDP (the wrapper forwards the
    call, every rank derives the same order and the wrapper shards it). Without ``set_epoch`` the
    order stays that of the last epoch set. Epoch 0 is the first-pass order of
    ``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))`` (what the
    DataModules used before).

    Args:
        num_items: dataset length.
        seed: base seed.
        with_epoch: yield ``(epoch, index)`` keys instead of indices, for datasets whose random
            augmentation is seeded per sample and epoch (:class:`MappedDataset` with a seed).
    """

    def __init__(self, num_items: int, seed: int = 0, with_epoch: bool = False):
        self.num_items, self.seed, self.with_epoch = int(num_items), int(seed), with_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_items

    def __iter__(self) -> Iterator:
        epoch = self.epoch
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        # Skip the draw a DataLoader makes for its worker base seed before shuffling, so epoch 0
        # keeps the order of DataLoader(shuffle=True, generator=Generator().manual_seed(seed)).
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        order = torch.randperm(self.num_items, generator=generator).tolist()
        return iter([(epoch, index) for index in order] if self.with_epoch else order)


def shard_batch_count(images: int, world_size: int, batch_size: int) -> int:
    """How many batches every process reads of ``images`` split over ``world_size`` processes: those of the largest
    shard (``ceil(images / world_size)`` images) in batches of ``batch_size``."""
    return -(-(-(-images // world_size)) // batch_size)


def shard_batches(images: int, rank: int, world_size: int, batch_size: int) -> list[list[int]]:
    """The batches of process ``rank``'s shard (every ``world_size``-th of ``images``, from ``rank``; indices into the
    shard): as many on every process (:func:`shard_batch_count`), since the processes step through them together
    (Lightning exchanges a tensor at every training batch of a multi-process run: a process with one batch more would
    wait for the others forever). Each batch holds ``batch_size`` images while the shard has enough for its remaining
    batches to get one each; the last ones are smaller. A shard too small for one image per batch (only with
    ``batch_size`` 1) is refused by :meth:`VisionDataModule.shard`."""
    count = len(range(rank, images, world_size))
    total = shard_batch_count(images, world_size, batch_size)
    batches, start = [], 0
    for i in range(total):
        size = max(1, min(batch_size, count - start - (total - 1 - i)))
        batches.append(list(range(start, min(start + size, count))))
        start += size
    return batches


class FixedBatches(Sampler):
    """A batch sampler that yields the given batches of indices, in order."""

    def __init__(self, batches: list[list[int]]):
        self.batches = [list(batch) for batch in batches]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator:
        return iter([list(batch) for batch in self.batches])


class _DeferredIterator:
    """Creates the real DataLoader iterator at the first ``next()``; counts the batches it hands out."""

    def __init__(self, loader: "DeferredDataLoader", start: Callable[[], Iterator]):
        self._loader, self._start, self._iterator = loader, start, None

    def __iter__(self) -> "_DeferredIterator":
        return self

    def __next__(self):
        if self._iterator is None:
            self._iterator = self._start()
        batch = next(self._iterator)
        self._loader._position["batches"] += 1
        self._loader._skip = 0  # the pass has begun: later passes start at their first batch
        return batch


class _SkipFirst:
    """The loader's batch sampler, each pass starting after the loader's ``_skip`` batches (indices only: no data is
    loaded for the skipped batches). It holds its loader weakly: the loader's (persistent) iterator holds this sampler,
    and a cycle back to the loader would keep a dropped loader and its worker processes alive until the garbage
    collector ran, possibly inside another loader's worker (a forked copy), which then printed tracebacks of workers
    it did not own."""

    def __init__(self, batch_sampler: Any, loader: "DeferredDataLoader"):
        self.batch_sampler, self._loader = batch_sampler, weakref.ref(loader)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator:
        return itertools.islice(iter(self.batch_sampler), getattr(self._loader(), "_skip", 0), None)


class DeferredDataLoader(DataLoader):
    """A DataLoader whose ``iter()`` draws nothing from its sampler until the first batch is asked for, and that
    resumes in the middle of a pass.

    With worker processes, a plain DataLoader iterator takes its first indices from the sampler as
    soon as it is created. Lightning (2.5.3 - 2.6, issue Lightning-AI/pytorch-lightning#21938)
    creates the training iterator before it calls ``set_epoch`` and, when resuming, before it has
    restored the epoch; the first resumed epoch would then replay epoch 0's order. Deferring the
    start until the first batch means the sampler sees the epoch Lightning has set by then.

    Its ``state_dict`` (saved by Lightning in every training checkpoint) is the epoch and the batches handed out so
    far in the current pass; a run restarted from a checkpoint taken in the middle of an epoch (a preempted
    fine-tune) skips those batches' indices, so it sees exactly the batches an uninterrupted run would.
    """

    def __iter__(self) -> Iterator:
        return _DeferredIterator(self, self._start)

    def _start(self) -> Iterator:
        self._position = {"epoch": self._epoch(), "batches": 0}  # the epoch Lightning has set by the first batch
        resume = getattr(self, "_resume", None)
        self._resume = None
        self._skip = 0
        if resume and resume["batches"] and resume["epoch"] == self._epoch():  # the interrupted pass, not a new one
            self._position["batches"] = self._skip = resume["batches"]
        return super().__iter__()

    @property
    def _index_sampler(self) -> Any:
        sampler = super()._index_sampler
        return _SkipFirst(sampler, self) if self._auto_collation else sampler

    def _epoch(self) -> Optional[int]:
        return getattr(self.sampler, "epoch", None)

    def state_dict(self) -> dict[str, Any]:
        """Where the current pass stands: ``{"epoch", "batches"}`` (batches handed out)."""
        return dict(getattr(self, "_position", {"epoch": self._epoch(), "batches": 0}))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the pass ``state`` describes: its next iteration (if it is that pass, same epoch) skips the
        batches already handed out."""
        self._resume = {"epoch": state.get("epoch"), "batches": int(state.get("batches", 0))}


class MappedDataset(Dataset):
    """Dataset of ``fn(*dataset[i])``.

    Args:
        dataset: yields (image, target) tuples.
        fn: picklable callable taking (image, target).
        seed: if set, ``fn`` runs under torch, Python and NumPy RNGs seeded from ``(seed, i)``:
            random augmentations of sample ``i`` are then the same in every process and worker, so
            statistics summed over a data set do not depend on how it is split across DDP ranks.
            The dataset also accepts ``(epoch, i)`` keys (from :class:`EpochSeededSampler` with
            ``with_epoch``): the augmentation then changes from epoch to epoch but stays a function
            of ``(seed, epoch, i)``, so a resumed run sees the same crops as an uninterrupted one.
    """

    def __init__(self, dataset: Dataset, fn: Callable, seed: Optional[int] = None):
        self.dataset, self.fn, self.seed = dataset, fn, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Union[int, tuple[int, int]]):
        epoch, index = key if isinstance(key, tuple) else (0, key)
        if self.seed is None:
            return self.fn(*self.dataset[index])
        with seeded_rngs(epoch_seed(self.seed * 1_000_003 + int(index), epoch)):
            return self.fn(*self.dataset[index])


class TransformImage:
    """(image, target) -> (transform(image), target); with keep_target=False only the image."""

    def __init__(self, transform: Callable, keep_target: bool = True):
        self.transform, self.keep_target = transform, keep_target

    def __call__(self, image, target):
        return (self.transform(image), target) if self.keep_target else self.transform(image)


def find_timm_model(module: nn.Module) -> Optional[nn.Module]:
    """First submodule that looks like a timm model (has pretrained_cfg or patch_embed)."""
    return next((m for m in module.modules() if hasattr(m, "pretrained_cfg") or hasattr(m, "patch_embed")), None)


class VisionDataModule(pl.LightningDataModule, metaclass=ABCMeta):
    """Base of the classification and segmentation DataModules (see their docstrings for the args).

    Subclasses implement ``_build_split(split)`` (untransformed (PIL image, target) dataset),
    ``_sample_files(dataset)`` (index -> files of a sample, or None when not file-backed),
    ``_labeled_fn(split)`` and ``_plain_transform()``.
    """

    def __init__(
        self,
        root: str = "data",
        download: bool = False,
        batch_size: PositiveInt = 64,
        num_workers: NonNegativeInt = 0,
        pin_memory: bool = False,
        seed: Optional[Seed] = None,
        max_samples: Optional[PositiveInt] = None,
        skip_corrupt: bool = False,
        train_augment: bool = False,
        train_views: Literal["labeled", "plain", "multicrop"] = "labeled",
        model_name: Optional[str] = None,
        data_config: Optional[dict[str, Any]] = None,
        n_global_views: NonNegativeInt = N_GLOBAL_VIEWS,
        n_local_views: NonNegativeInt = N_LOCAL_VIEWS,
        global_crop_scale: tuple[float, float] = GLOBAL_CROP_SCALE,
        local_crop_scale: tuple[float, float] = LOCAL_CROP_SCALE,
        multicrop_color_jitter: ClosedUnitInterval = 0.0,
        multicrop_hflip: ClosedUnitInterval = 0.0,
    ):
        super().__init__()
        check_arguments(VisionDataModule.__init__, locals(), "data.init_args", skip={"self"})
        problems = [f"{name} must be (low, high) with 0 < low <= high <= 1, got {value}" for name, value in
                     (("global_crop_scale", global_crop_scale), ("local_crop_scale", local_crop_scale))
                     if len(tuple(value)) != 2 or not 0 < value[0] <= value[1] <= 1]
        if problems:
            raise ConfigError("data: " + "; ".join(problems))
        self.root, self.download = root, download
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.seed = resolve_seed(seed)
        self.max_samples, self.skip_corrupt, self.train_augment = max_samples, skip_corrupt, train_augment
        self.train_views = train_views
        self.model_name, self.data_config_overrides = model_name, dict(data_config or {})
        self.multicrop_args = dict(n_global=n_global_views, n_local=n_local_views, global_scale=global_crop_scale,
                                   local_scale=local_crop_scale, color_jitter=multicrop_color_jitter,
                                   hflip=multicrop_hflip)
        self._model_config: Optional[dict[str, Any]] = None
        self._bases: dict[str, Dataset] = {}
        self._subsets: dict[tuple[str, Optional[int]], Dataset] = {}
        self.skipped: dict[str, list[str]] = {}

    # -- model-dependent input pipeline ---------------------------------------------------
    def configure_for_model(self, model: Union[nn.Module, Mapping[str, Any]]) -> dict[str, Any]:
        """Take input size, channels, mean/std and interpolation from a timm model (or its
        pretrained_cfg / data-config dict); data_config overrides still apply. Returns the config.

        Only the resolved config is kept, not the model."""
        self._model_config = resolve_input_config(model) if isinstance(model, nn.Module) else dict(model)
        return self.input_config

    @property
    def labeled(self) -> bool:
        """Whether the data has labels (evaluation, label-based scorers); a folder of unlabeled images has none."""
        return True

    @property
    def input_config(self) -> dict[str, Any]:
        """Resolved timm data config: input_size (C, H, W), mean, std, interpolation, crop_pct."""
        return resolve_input_config(self._model_config, self.model_name, self.data_config_overrides)

    # -- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: Optional[str] = None) -> None:
        """Build the train/val datasets in this process (no downloads here)."""
        if self._model_config is None and self.trainer is not None and self.trainer.lightning_module is not None:
            timm_model = find_timm_model(self.trainer.lightning_module)
            if timm_model is not None:
                self.configure_for_model(timm_model)
        built = [split for split in SPLITS if split not in self._bases]
        for split in built:
            self._bases[split] = self._build_split(split)
        if built:
            self._refuse_shared_files()

    def _refuse_shared_files(self) -> None:
        """Refuse one real file read as two images (under two classes, or in both splits: a measurement on training
        images): checked once, on the file lists of both splits, for every layout (:func:`refuse_shared_files`)."""
        lists = {}
        for split, dataset in self._bases.items():
            sample_files = self._sample_files(dataset)
            if sample_files is not None:  # the image of each sample (its first file; a mask may be shared)
                lists[split] = [sample_files(index)[0] for index in range(len(dataset))]
        refuse_shared_files(lists)

    def base_dataset(self, split: str) -> Dataset:
        """Untransformed (PIL image, target) dataset of a split ("train" or "val"), all samples."""
        if split not in SPLITS:
            raise DataError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        if split not in self._bases:
            self.setup()
        return self._bases[split]

    def dataset(self, split: str, max_samples: Optional[int] = None) -> Dataset:
        """Untransformed split restricted to a seeded class-balanced subset (cached).

        With skip_corrupt, unreadable samples are passed over and their paths listed in
        ``self.skipped[split]``.

        Args:
            split: "train" or "val".
            max_samples: subset size (None: the module's max_samples).
        """
        base = self.base_dataset(split)
        limit = self.max_samples if max_samples is None else max_samples
        if (split, limit) in self._subsets:
            return self._subsets[split, limit]
        sample_files = self._sample_files(base) if self.skip_corrupt else None
        unreadable: list[str] = []

        def keep(index: int) -> bool:
            bad = [path for path in sample_files(index) if not is_readable(path)]
            unreadable.extend(bad)
            return not bad

        indices = balanced_subset_indices(len(base), dataset_targets(base), limit, self.seed,
                                          keep if sample_files is not None else None)
        if sample_files is not None:
            new = sorted(set(unreadable) - set(self.skipped.get(split, [])))  # each file is reported once
            self.skipped[split] = sorted(set(self.skipped.get(split, [])) | set(unreadable))
            if new:
                log.warning("skipped %d unreadable file(s) in the %s split: %s%s", len(new), split,
                            ", ".join(new[:3]), " ..." if len(new) > 3 else "")
        subset = base if len(indices) == len(base) else Subset(base, indices)
        self._subsets[split, limit] = subset
        return subset

    def labeled_dataset(self, split: str, max_samples: Optional[int] = None) -> Dataset:
        """Transformed (image, target) dataset of a split; random training augmentation (train
        split with train_augment) is seeded per sample and epoch (see :class:`MappedDataset`)."""
        if not self.labeled:
            raise DataError(f"{self.root} is a folder of unlabeled images: enough for pruning with a label-free "
                            "scorer, but evaluation (evaluation.metrics: set []), label-based scorers and fine-tuning "
                            "with labels need labeled images (root/train/<class>/..., see the data layouts)")
        seed = self.seed if self.train_augment and split == "train" else None
        return MappedDataset(self.dataset(split, max_samples), self._labeled_fn(split), seed)

    def unlabeled_dataset(self, split: str = "train", views: Views = "plain",
                          max_samples: Optional[int] = None) -> Dataset:
        """Images only: plain eval views [C, H, W] or multi-crop views [V, C, H, W]."""
        if views == "plain":
            transform = self._plain_transform()
        elif views == "multicrop":
            transform = MultiCropTransform(self.input_config, **self.multicrop_args)
        else:
            raise DataError(f"unknown views {views!r}; use 'plain' or 'multicrop'")
        seed = self.seed if views == "multicrop" else None  # per-sample crops, identical across ranks
        return MappedDataset(self.dataset(split, max_samples), TransformImage(transform, keep_target=False), seed)

    def unlabeled_dataloader(self, views: Views = "plain", batch_size: Optional[int] = None,
                             max_samples: Optional[int] = None, split: str = "train",
                             shuffle: bool = False) -> DataLoader:
        """Batches of unlabeled images for pruning: multi-crop for the self-supervised scorer,
        plain for the search fitness and weight correction.

        Args:
            views: "plain" ([B, C, H, W]) or "multicrop" ([B, V, C, H, W]).
            batch_size: default the module's batch_size.
            max_samples: seeded class-balanced subset size (default the module's max_samples).
            split: "train" or "val".
            shuffle: reshuffle every epoch (seeded).
        """
        return self._loader(self.unlabeled_dataset(split, views, max_samples), shuffle, batch_size)

    def labeled_dataloader(self, split: str = "val", max_samples: Optional[int] = None,
                           batch_size: Optional[int] = None, shuffle: bool = False) -> DataLoader:
        """Batches of (images [B, C, H, W], labels [B] or masks [B, H, W]) for evaluation.

        Args:
            split: "train" or "val".
            max_samples: seeded class-balanced subset size (default the module's max_samples).
            batch_size: default the module's batch_size.
            shuffle: reshuffle every epoch (seeded).
        """
        return self._loader(self.labeled_dataset(split, max_samples), shuffle, batch_size)

    def unlabeled_images(self, max_samples: Optional[int] = None, batch_size: Optional[int] = None) -> torch.Tensor:
        """Plain views of a fixed train subset stacked into one ``[N, C, H, W]`` tensor (search
        fitness images, calibration images).

        Raises:
            DataError: the subset is empty.
        """
        images = [batch for batch in self.unlabeled_dataloader("plain", batch_size, max_samples)]
        if not images:
            raise DataError("the pruning data set is empty; check data.init_args.root and max_samples")
        return torch.cat(images)

    def shard(self, rank: int, world_size: int) -> None:
        """Read only this process's share of the training images: every ``world_size``-th, from ``rank`` (no image
        twice, none left out, whatever the count: summed statistics equal a single process's). Lightning's
        distributed sampler pads a shard by repeating images, so a run that shards turns it off
        (``Trainer(use_distributed_sampler=False)``, as ``prune.py`` does).

        Raises:
            ConfigError: fewer training images than processes.
        """
        images = len(self.dataset("train"))
        if world_size > 1 and images < world_size:
            raise ConfigError(f"{images} training image(s) for {world_size} processes: every process needs at least "
                              "one; raise data.init_args.max_samples or lower --trainer.devices")
        if world_size > 1 and images // world_size < shard_batch_count(images, world_size, self.batch_size):
            raise ConfigError(
                f"data.batch_size {self.batch_size}: {images} images on {world_size} processes give them different "
                f"numbers of batches ({-(-images // world_size)} and {images // world_size}), and the processes step "
                f"through their batches together; raise data.init_args.batch_size, or score a multiple of "
                f"{world_size} images (data.init_args.max_samples)")
        self._shard = (int(rank), int(world_size)) if world_size > 1 else None

    def train_dataloader(self) -> DataLoader:
        dataset = (self.unlabeled_dataset("train", self.train_views) if self.train_views != "labeled"
                   else self.labeled_dataset("train"))
        shard = getattr(self, "_shard", None)
        if shard is not None:  # the crops and probes of an image are seeded by its index: the same in any shard
            rank, world = shard
            batches = shard_batches(len(dataset), rank, world, self.batch_size)
            return self._loader(Subset(dataset, range(rank, len(dataset), world)), shuffle=False, batches=batches)
        return self._loader(dataset, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Labeled val batches; image-only ones when the module trains on images only (``train_views`` plain or
        multicrop: label-free fine-tuning)."""
        if self.train_views != "labeled":
            return self.unlabeled_dataloader("plain", split="val")
        return self.labeled_dataloader("val")

    def test_dataloader(self) -> DataLoader:
        """The val split (the evaluation split of ImageNet, ADE20K and VOC)."""
        return self.val_dataloader()

    def _loader(self, dataset: Dataset, shuffle: bool, batch_size: Optional[int] = None,
                batches: Optional[list[list[int]]] = None) -> DataLoader:
        # Shuffling by (seed, epoch), not by a generator that advances from pass to pass: a run
        # resumed from a checkpoint then gets the same order as an uninterrupted one.
        # ``batches``: the batches of ``dataset`` itself (indices), in order (a shard's: :func:`shard_batches`).
        if batches is not None:
            workers = min(self.num_workers, cpu_cores())
            return DeferredDataLoader(
                dataset, batch_sampler=FixedBatches(batches), num_workers=workers, pin_memory=self.pin_memory,
                persistent_workers=workers > 0, generator=torch.Generator().manual_seed(self.seed))
        sampler = None
        if shuffle:
            per_sample_seeds = isinstance(dataset, MappedDataset) and dataset.seed is not None
            sampler = EpochSeededSampler(len(dataset), self.seed, with_epoch=per_sample_seeds)
        workers = min(self.num_workers, cpu_cores())  # a config's 8 workers on a 2-core laptop: 2
        return DeferredDataLoader(
            dataset, batch_size=batch_size or self.batch_size, sampler=sampler, num_workers=workers,
            pin_memory=self.pin_memory, persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(self.seed),  # worker base seeds: not drawn from the global RNG
        )

    # -- what a run read ---------------------------------------------------------------------
    def input_fingerprint(self, max_samples: Sequence[Optional[int]] = (None,), split: str = "train") -> dict[str, Any]:
        """The fingerprint of what a run reads of ``split``: the files of the samples that the seeded subsets of sizes
        ``max_samples`` (None: the module's ``max_samples``; the pruning pass's subset) take, in their order, each as
        ``[path, label, size, modification time (ns), sha256 of its bytes]`` (label -1 when unlabeled); for a data set
        read from a few source files (Fashion-MNIST's IDX files, :meth:`_source_files`) those files whole, and
        ``samples``: the indices of the samples read in them (another seed or ``max_samples`` reads others). ``listed``:
        how many samples the split lists (the subsets are drawn from all of them). A resumed run compares it with the
        interrupted run's (:func:`snapvit_pl.run.resume.check_inputs`). Subclasses may refine it; a data set
        with neither per-sample nor source files has no files to fingerprint (``files`` empty).

        Raises:
            DataError: a file that cannot be read.
        """
        base = self.base_dataset(split)
        sample_files = self._sample_files(base)
        indices: set[int] = set()
        for limit in max_samples:
            subset = self.dataset(split, limit)
            indices.update(subset.indices if subset is not base else range(len(base)))
        if sample_files is None:  # the files whole, and which of their samples were read
            files = [(path, -1) for path in self._source_files(base)]
            read = {"samples": sorted(int(i) for i in indices)}
        else:
            targets = dataset_targets(base)
            files = [(path, -1 if targets is None else targets[index])
                     for index in sorted(indices) for path in sample_files(index)]
            read = {}
        return {"split": split, "listed": len(base), "files": [_file_record(path, label) for path, label in files],
                **read}

    def listing_fingerprint(self, split: str = "train") -> dict[str, Any]:
        """A cheap fingerprint of what training reads of ``split`` (its seeded ``max_samples`` subset), reading no
        image: the data set's kind and source, and a sha256 of each sample's file paths (relative to ``root``) and
        label, or of the source files' names and sizes for a data set read from a few files (Fashion-MNIST). A
        training checkpoint records it, and a fit resumed from the checkpoint on other data is refused.

        Returns:
            ``{"sha256": ..., "samples": N, "data": "<source> <root>"}``.
        """
        import hashlib

        base, subset = self.base_dataset(split), self.dataset(split)
        indices = list(subset.indices) if subset is not base else list(range(len(base)))
        targets = dataset_targets(base)
        source = str(getattr(self, "source", type(self).__name__))
        digest = hashlib.sha256(f"{type(self).__name__}:{source}:{split}:{len(indices)}".encode())
        sample_files = self._sample_files(base)
        prefix = os.path.join(os.path.abspath(self.root), "") if self.root else "\0"
        if sample_files is not None:
            for index in indices:
                label = -1 if targets is None else targets[index]
                for path in sample_files(index):
                    path = os.path.abspath(path)
                    shown = path[len(prefix):] if path.startswith(prefix) else path
                    digest.update(f"{shown}\0{label}\n".encode(errors="surrogateescape"))
        else:
            for path in self._source_files(base):
                size = os.path.getsize(path) if os.path.isfile(path) else -1
                digest.update(f"{os.path.basename(path)}\0{size}\n".encode(errors="surrogateescape"))
            digest.update(",".join(map(str, indices)).encode())
        return {"sha256": digest.hexdigest(), "samples": len(indices), "data": f"{source} {self.root or ''}".strip()}

    def _source_files(self, dataset: Dataset) -> list[str]:
        """The files a data set without per-sample files is read from: the ``source_files`` of ``dataset`` or of a
        data set it wraps (``dataset``, ``items``); [] when none is known."""
        seen = 0
        while dataset is not None and seen < 8:
            files = getattr(dataset, "source_files", None)
            if files:
                return [str(path) for path in files]
            inner = getattr(dataset, "dataset", None)
            dataset, seen = inner if inner is not None else getattr(dataset, "items", None), seen + 1
        return []

    # -- subclass interface -----------------------------------------------------------------
    @abstractmethod
    def _build_split(self, split: str) -> Dataset:
        """Untransformed (PIL image, target) dataset of ``split``."""

    @abstractmethod
    def _sample_files(self, dataset: Dataset) -> Optional[Callable[[int], Sequence[str]]]:
        """index -> files of that sample (for ``skip_corrupt``), or None when not file-backed."""

    @abstractmethod
    def _labeled_fn(self, split: str) -> Callable:
        """(image, target) -> transformed (image, target) for ``split``."""

    @abstractmethod
    def _plain_transform(self) -> Callable:
        """image -> plain eval view [C, H, W]."""
