"""Stage 1: local importance of every head and MLP neuron from one pass over the pruning data."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Optional

from torch import Tensor, nn

from ..errors import ConfigError, DataError
from ..progress import Progress, ProgressMode
from ..scoring import LocalScores, Scorer
from ..scoring.base import ScoringContext

if TYPE_CHECKING:  # (annotations only)
    from .driver import Pipeline

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


#: The DataModule's ``train_views`` when not set (``VisionDataModule``'s default): left to the pruning run.
DEFAULT_TRAIN_VIEWS = "labeled"
#: What each kind of views is, for messages.
VIEWS_SHOWN = {"multicrop": "multi-crop views [B, V, C, H, W]", "labeled": "labeled (images, labels) batches",
               "plain": "plain images [B, C, H, W]"}


def check_train_views(datamodule: Any, scorer: Scorer) -> DataViews:
    """The views ``scorer`` needs; refuses a DataModule whose ``train_views`` asks for others (the pruning run sets them
    itself, so the option would do nothing).

    Raises:
        ConfigError: ``train_views`` neither its default (``labeled``) nor the scorer's views.
    """
    needed = scoring_views(scorer)
    given = getattr(datamodule, "train_views", DEFAULT_TRAIN_VIEWS)
    if given not in (DEFAULT_TRAIN_VIEWS, needed):
        raise ConfigError(
            f"data.init_args.train_views {given} has no effect in a pruning run: it feeds each scorer the views it "
            f"needs, and the {scorer.name} scorer needs {needed} ({VIEWS_SHOWN.get(needed, needed)}); leave "
            f"data.init_args.train_views unset (or set it to {needed})")
    return needed


def match_global_views(datamodule: Any, scorer: Scorer) -> Optional[int]:
    """The DataModule's global crops per sample (``data.init_args.n_global_views``: a multi-crop scorer's teacher
    inputs, for its :class:`~snapvit_pl.scoring.base.ScoringContext`); refuse a scorer ``n_global`` that differs, and
    views a self-distillation loss cannot use. None for a DataModule-like object without ``multicrop_args`` (it makes
    its own views).

    Raises:
        ConfigError: naming both options.
    """
    multicrop = getattr(datamodule, "multicrop_args", None)
    if multicrop is None:
        return None
    data_global, data_local = int(multicrop["n_global"]), int(multicrop.get("n_local", 0))
    own = getattr(scorer, "n_global", None)
    if own is not None and int(own) != data_global:
        raise ConfigError(
            f"importance.scorer.init_args.n_global {own} differs from data.init_args.n_global_views {data_global}: the "
            f"{scorer.name} scorer's teacher takes the global crops the data makes; leave n_global unset (it follows "
            "data.init_args.n_global_views) or give both the same value")
    if data_global < 1 or data_global + data_local < 2:
        raise ConfigError(
            f"the {scorer.name} scorer compares a teacher's global crops with every view of a sample: it needs "
            f"data.init_args.n_global_views >= 1 and at least 2 views in all, got n_global_views {data_global} and "
            f"n_local_views {data_local}")
    return data_global


def prepare_pruning_data(datamodule: Any, model: nn.Module, scorer: Scorer) -> dict[str, Any]:
    """Set a DataModule up for the importance pass: the model's input format and the views ``scorer`` needs. Returns
    what the data tells the scorer (:class:`~snapvit_pl.scoring.base.ScoringContext` fields): the global crops per
    sample of a multi-crop scorer (:func:`match_global_views`) and the batch size.

    Raises:
        DataError: the pruning data set is empty.
        ConfigError: its batch size exceeds the number of images; ``data.init_args.train_views`` asks for views
            other than the scorer's; the scorer's ``n_global`` differs from ``data.init_args.n_global_views``.
    """
    views = check_train_views(datamodule, scorer)
    global_views = match_global_views(datamodule, scorer) if views == "multicrop" else None
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
    datamodule.train_views = views
    return {"global_views": global_views, "batch_size": int(datamodule.batch_size)}


class ImportancePass:
    """The importance stage's loop, defined once: the pipeline (and so the Lightning callback, which feeds it the
    Trainer's batches) and :func:`local_importance` drive it. A scorer bound to the model is fed batch by batch
    (:meth:`step`); at each pass's end (:meth:`end_pass`) its statistics are summed over processes, then the next pass
    starts or, after the last, the local scores are computed. A data-free scorer makes no pass: :meth:`end_pass` alone
    gives its scores.

    Args:
        scorer: the scorer's specification; an accumulator of it is bound to ``model`` (:meth:`Scorer.bind`) and
            dropped with this object.
        model: the timm model to score, on the device the batches go to.
        context: what the run hands the scorer (keep ratios, the data's global crops and batch size, a teacher).
        all_reduce_sum: sums a tensor over DDP processes (each process feeds its shard of the data).
        batches: batches per pass, when known (the progress bar's total).
        progress: show progress (a :class:`snapvit_pl.progress.Progress` mode).
    """

    def __init__(self, scorer: Scorer, model: nn.Module, context: Optional[ScoringContext] = None,
                 all_reduce_sum: Optional[AllReduceSum] = None, batches: Optional[int] = None,
                 progress: ProgressMode | bool = False):
        self.scorer = scorer.bind(model, context)
        self.model = model
        #: passes over the data (0: a data-free scorer)
        self.passes = self.scorer.passes if self.scorer.requires_data else 0
        self.finished = 0  # passes ended
        self._reduce = all_reduce_sum or (lambda t: t)
        self.bar = Progress("importance", None if batches is None else batches * self.passes,
                            progress if self.scorer.requires_data else "off", unit="batch")

    def step(self, batch: Any) -> dict[str, Any]:
        """Feed one batch to the scorer; returns what it logs (e.g. ``{"loss": ...}``)."""
        metrics = self.scorer.update(batch) if self.scorer.requires_data else {}
        self.bar.update(**metrics)
        return metrics

    def end_pass(self) -> Optional[LocalScores]:
        """End a pass over the data: the statistics summed over processes; the next pass started (returns None), or,
        after the last, the local scores."""
        self.scorer.reduce(self._reduce)
        self.finished += 1
        if self.finished < self.passes:
            self.scorer.next_pass()
            return None
        self.bar.close()
        return self.scorer.compute().validate(self.model, scorer=self.scorer.name)

    def run(self, batches: Iterable[Any], end_pass: Optional[Callable[[], Optional[LocalScores]]] = None) -> LocalScores:
        """Every pass over ``batches`` (none for a data-free scorer); returns the local scores. ``end_pass``: what
        ends a pass (default :meth:`end_pass`; the pipeline's records the scores too)."""
        end_pass = end_pass or self.end_pass
        with self.bar:  # (closed as stopped if a batch fails)
            while True:
                if self.passes:
                    for batch in batches:
                        self.step(batch)
                local = end_pass()
                if local is not None:
                    return local


def local_importance(
    scorer: Scorer,
    model: nn.Module,
    batches: Iterable[Any],
    context: Optional[ScoringContext] = None,
    all_reduce_sum: Optional[AllReduceSum] = None,
    progress: ProgressMode | bool = False,
) -> LocalScores:
    """Local scores of ``model`` from one pass over ``batches`` per scorer pass (none for data-free scorers): the
    :class:`ImportancePass` the pipeline runs.

    Args:
        scorer: the scorer's specification (see :func:`scoring_views` for the batches it needs); an accumulator of it
            is bound to ``model`` and dropped (:meth:`~snapvit_pl.scoring.Scorer.bind`).
        model: the timm model to score, on the device the batches go to.
        batches: multi-crop ``[B, V, C, H, W]`` views for self-supervised scorers, ``(images, labels)``
            for label-based ones.
        context: what the run hands the scorer (keep ratios, the data's global crops and batch size, a teacher).
        all_reduce_sum: sums a tensor over DDP processes (each process passes its shard of the data).
        progress: show progress (a :class:`snapvit_pl.progress.Progress` mode).
    """
    check_passes(scorer, batches)
    return ImportancePass(scorer, model, context, all_reduce_sum, len(batches) if hasattr(batches, "__len__") else None,
                          progress).run(batches)


def check_passes(scorer: Scorer, batches: Any) -> None:
    """Refuse batches that can be read once (an iterator) for a scorer that reads them several times.

    Raises:
        ConfigError: naming the scorer's passes.
    """
    if scorer.requires_data and scorer.passes > 1 and iter(batches) is batches:
        raise ConfigError(f"the {scorer.name} scorer reads the pruning images {scorer.passes} times (one pass per "
                          "stage): give batches that can be read again (a DataLoader or a list), not an iterator")


def scoring_context(pipe: "Pipeline") -> ScoringContext:
    """What ``pipe``'s run hands its scorer: the keep ratios (``importance.min_mlp_keep`` / ``min_head_keep``) and,
    from a DataModule (:func:`~.data_source.use_datamodule`), its global crops per sample and batch size."""
    importance = pipe.settings.importance
    return ScoringContext(min_mlp_keep=importance.min_mlp_keep, min_head_keep=importance.min_head_keep,
                          **pipe.work.data_context)


def start_pass(pipe: "Pipeline", batches: Optional[int]) -> ImportancePass:
    """The importance pass of ``pipe``'s run, its scorer bound to the model (:func:`scoring_context`); the stage's
    clock and memory start."""
    pipe.work.importance_started = {"started": time.perf_counter(), "memory": pipe.start_memory()}
    return ImportancePass(pipe.settings.importance.scorer, pipe.model, scoring_context(pipe), pipe.dist.all_reduce_sum,
                          batches, pipe.progress_mode())


def finish_pass(pipe: "Pipeline") -> Optional[LocalScores]:
    """End a pass over the data: the scorer's statistics summed over processes; after its last pass, the local
    scores computed, allocated, recorded with the scorer's own choices and the run's progress saved (None while
    passes remain)."""
    from .inputs import LoaderInputs

    local = pipe.work.importance_pass.end_pass()
    if local is None:
        if isinstance(pipe.inputs, LoaderInputs):
            pipe.inputs.new_pass()
        return None
    pipe.state.local = local.allocated(pipe.settings.importance.allocation)
    record_scorer_choices(pipe, pipe.work.importance_pass.scorer.choices())
    pipe.work.importance_pass = None  # its accumulators (a Gram of gigabytes) are not needed once the scores exist
    pipe.state.timings.add("scoring", time.perf_counter() - pipe.work.importance_started["started"])
    pipe.state.peak_memory_mb["importance"] = round(pipe.work.importance_started["memory"].peak_mb(), 1)
    pipe.work.importance_started = None
    pipe.end_stage("importance")
    pipe.save_progress()
    return pipe.state.local


def record_scorer_choices(pipe: "Pipeline", choices: dict[str, str]) -> None:
    """What the scorer chose for itself (e.g. ``gram: auto`` -> ``full``), in the run's record of the method and
    in its resume state (a resumed run skips the importance pass but reports the same choices)."""
    pipe.work.scorer_choices = dict(choices)
    pipe.state.method["scorer"] = {**pipe.state.method.get("scorer", {}), **choices}
