"""The base DataModule of every data set the project reads (:class:`VisionDataModule`)."""
from __future__ import annotations

import logging
import os
from abc import ABCMeta, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Literal, Optional, Union

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from ..device import cpu_cores
from ..errors import ConfigError, DataError
from ..ranges import ClosedUnitInterval, NonNegativeInt, PositiveInt, Seed, check_arguments
from ..seeding import resolve_seed
from .folders import refuse_shared_files
from .images import file_record, is_readable
from .transforms import (
    GLOBAL_CROP_SCALE, LOCAL_CROP_SCALE, N_GLOBAL_VIEWS, N_LOCAL_VIEWS, MultiCropTransform, resolve_input_config,
)
from .sampling import (
    DeferredDataLoader, EpochSeededSampler, FixedBatches, MappedDataset, TransformImage, balanced_subset_indices,
    dataset_targets, shard_batch_count, shard_batches,
)

log = logging.getLogger(__name__)

Views = Literal["plain", "multicrop"]
SPLITS = ("train", "val")


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
        return {"split": split, "listed": len(base), "files": [file_record(path, label) for path, label in files],
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
