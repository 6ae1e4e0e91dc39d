"""Which samples a run reads, and in which order: seeded class-balanced subsets, epoch seeds, shards across
processes, the loaders that defer or skip batches."""
from __future__ import annotations

import itertools
import logging
import random
import weakref
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset


log = logging.getLogger(__name__)


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
