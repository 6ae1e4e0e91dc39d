"""Stage 1: local importance of every head and MLP neuron from one pass over the pruning data."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Optional

from torch import Tensor, nn
from tqdm.auto import tqdm

from ..elastic.ranking import MIN_HEAD_KEEP, MIN_MLP_KEEP
from ..errors import ConfigError, DataError
from ..scoring import LocalScores, Scorer, SSLFisher

AllReduceSum = Callable[[Tensor], Tensor]
DataViews = Literal["multicrop", "labeled", "plain"]


@dataclass
class ImportanceSettings:
    """Which local score, and how much of each block is protected from pruning.

    Args:
        scorer: any :class:`snapvit_pl.scoring.Scorer` (default ``SSLFisher()``, label-free).
        min_mlp_keep: share of each block's MLP neurons never pruned.
        min_head_keep: share of each block's heads never pruned.
    """

    scorer: Optional[Scorer] = None
    min_mlp_keep: float = MIN_MLP_KEEP
    min_head_keep: float = MIN_HEAD_KEEP

    def __post_init__(self) -> None:
        if self.scorer is None:
            self.scorer = SSLFisher()
        for name in ("min_mlp_keep", "min_head_keep"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"importance.{name} must lie in [0, 1], got {getattr(self, name)}")

    def scorer_record(self) -> dict[str, Any]:
        """The scorer's name and constructor arguments, for the record."""
        return {"name": self.scorer.name, **self.scorer.config()}


def scoring_views(scorer: Scorer) -> DataViews:
    """The batches a scorer needs: multi-crop views (self-supervised), labeled plain views, or none (plain)."""
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
        raise ConfigError(
            f"data.batch_size {datamodule.batch_size} is larger than the {images} pruning images; "
            "lower data.init_args.batch_size or raise data.init_args.max_samples"
        )
    datamodule.train_views = scoring_views(scorer)


def start_importance(scorer: Scorer, model: nn.Module, teacher: Optional[nn.Module] = None) -> None:
    """Bind ``scorer`` to ``model`` (and a frozen dense ``teacher``) and reset its accumulators."""
    scorer.setup(model, teacher)


def finish_importance(scorer: Scorer, all_reduce_sum: Optional[AllReduceSum] = None) -> LocalScores:
    """Sum the scorer's statistics over processes (DDP) and compute the local scores."""
    scorer.reduce(all_reduce_sum or (lambda t: t))
    return scorer.compute()


def local_importance(
    scorer: Scorer,
    model: nn.Module,
    batches: Iterable[Any],
    teacher: Optional[nn.Module] = None,
    all_reduce_sum: Optional[AllReduceSum] = None,
    progress: bool = False,
) -> LocalScores:
    """Local scores of ``model`` from one pass over ``batches`` (skipped for data-free scorers).

    Args:
        scorer: the scorer (see :func:`scoring_views` for the batches it needs).
        model: the timm model to score, on the device the batches go to.
        batches: multi-crop ``[B, V, C, H, W]`` views for self-supervised scorers, ``(images, labels)``
            for label-based ones.
        teacher: a frozen copy of ``model`` (made by the scorer when None).
        all_reduce_sum: sums a tensor over DDP processes (each process passes its shard of the data).
        progress: show a progress bar.
    """
    start_importance(scorer, model, teacher)
    if scorer.requires_data:
        for batch in tqdm(batches, desc="importance", disable=not progress, dynamic_ncols=True):
            scorer.update(batch)
    return finish_importance(scorer, all_reduce_sum)
