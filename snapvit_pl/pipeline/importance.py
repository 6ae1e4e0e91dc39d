"""Stage 1: local importance of every head and MLP neuron from one pass over the pruning data."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Literal, Optional

from torch import Tensor, nn

from ..errors import ConfigError, DataError
from ..progress import Progress, ProgressMode
from ..scoring import LocalScores, Scorer

AllReduceSum = Callable[[Tensor], Tensor]
DataViews = Literal["multicrop", "labeled", "plain"]


def scoring_views(scorer: Scorer) -> DataViews:
    """The batches a scorer needs: its own ``views`` if it names them (forward-only and sensitivity scorers:
    plain), else multi-crop views (self-supervised), labeled plain views, or none (plain)."""
    if scorer.views:
        return scorer.views
    if not scorer.requires_data:
        return "plain"
    return "labeled" if scorer.requires_labels else "multicrop"


def prepare_pruning_data(datamodule: Any, model: nn.Module, scorer: Scorer) -> None:
    """Set a DataModule up for the importance pass: the model's input format and the views ``scorer`` needs.

    Raises:
        DataError: the pruning data set is empty.
        ConfigError: its batch size exceeds the number of images.
    """
    datamodule.configure_for_model(model)
    images = len(datamodule.dataset("train"))
    if images == 0:
        raise DataError("the pruning data set is empty; check data.init_args.root and max_samples")
    if datamodule.batch_size > images:
        limit = getattr(datamodule, "max_samples", None)
        more = (" or raise data.init_args.max_samples" if limit is not None and images >= limit else
                f" (the data holds only {images} images: max_samples cannot give more)")
        raise ConfigError(f"data.batch_size {datamodule.batch_size} is larger than the {images} pruning images; "
                          f"lower data.init_args.batch_size{more}")
    datamodule.train_views = scoring_views(scorer)


def local_importance(
    scorer: Scorer,
    model: nn.Module,
    batches: Iterable[Any],
    teacher: Optional[nn.Module] = None,
    all_reduce_sum: Optional[AllReduceSum] = None,
    progress: ProgressMode | bool = False,
) -> LocalScores:
    """Local scores of ``model`` from one pass over ``batches`` (skipped for data-free scorers).

    Args:
        scorer: the scorer (see :func:`scoring_views` for the batches it needs).
        model: the timm model to score, on the device the batches go to.
        batches: multi-crop ``[B, V, C, H, W]`` views for self-supervised scorers, ``(images, labels)``
            for label-based ones.
        teacher: a frozen copy of ``model`` (made by the scorer when None).
        all_reduce_sum: sums a tensor over DDP processes (each process passes its shard of the data).
        progress: show progress (a :class:`snapvit_pl.progress.Progress` mode).
    """
    scorer.setup(model, teacher)
    if scorer.requires_data:
        total = len(batches) if hasattr(batches, "__len__") else None
        with Progress("importance", total, progress, unit="batch") as bar:
            for batch in batches:
                bar.update(**scorer.update(batch))
    scorer.reduce(all_reduce_sum or (lambda t: t))
    return scorer.compute()
