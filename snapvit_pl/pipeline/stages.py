"""The stages of a pruning run over one :class:`RunState`, in the order they run.

``prune.py``'s Lightning callbacks call these at fixed points of ``trainer.fit``; a plain Python
loop can call them in the same order (see :func:`snapvit_pl.api.fit_elastic`):

1. importance: ``start_importance`` / ``scorer.update(batch)`` per batch / :func:`finish_importance_stage`
2. search: :func:`search_stage`
3. export: :func:`export_stage` (elastic scores file, dense evaluation, one model per budget)
4. report: :func:`snapvit_pl.pipeline.report.write_report`
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..elastic.budget import CostModel
from ..elastic.latency import latency_table
from ..eval.suite import EvalData
from ..scoring import LocalScores
from .extraction import (
    Correction, CorrectionSettings, Evaluation, EvaluationSettings, ExportSettings, extract_models,
)
from .importance import AllReduceSum, ImportanceSettings, finish_importance
from .search import SearchSettings, run_search
from .splits import choose_splits
from .state import DenseModel, ExtractedModel, RunState


def record_importance(state: RunState, settings: ImportanceSettings, local: LocalScores) -> None:
    """Record complete local scores (computed, or restored by a resumed run), the scorer and the keep ratios."""
    state.local = local
    state.scorer = settings.scorer_record()
    state.min_mlp_keep, state.min_head_keep = settings.min_mlp_keep, settings.min_head_keep


def finish_importance_stage(state: RunState, settings: ImportanceSettings,
                            all_reduce_sum: Optional[AllReduceSum] = None) -> None:
    """Reduce the scorer's statistics (DDP sum), compute the local scores and record them in ``state``."""
    record_importance(state, settings, finish_importance(settings.scorer, all_reduce_sum))


def search_stage(state: RunState, model: nn.Module, images: torch.Tensor, settings: SearchSettings, **options: Any) -> None:
    """Search the coefficients for ``state.local`` and record them (``options``: see :func:`run_search`)."""
    state.search_settings = settings
    state.search = run_search(model, images, state.elastic_scores(), settings, **options)
    state.timings.search_s = state.search.seconds


def export_stage(
    state: RunState,
    base: nn.Module,
    settings: ExportSettings,
    run_dir: Optional[str | Path],
    correction: Optional[Correction] = None,
    evaluation: Optional[Evaluation] = None,
    fitness_images: Optional[torch.Tensor] = None,
    on_model: Optional[Callable[[ExtractedModel], None]] = None,
) -> None:
    """Choose the budgets' splits, write the elastic scores, evaluate the dense model, then extract
    (correct, evaluate, save) every budget.

    Args:
        state: the run so far (importance and search done).
        base: the dense base model.
        settings: budgets, rounding, what to save.
        run_dir: the run directory (None: nothing is written, e.g. on DDP ranks other than 0).
        correction, evaluation: the optional post-processing steps (corrected before evaluated).
        fitness_images: the search's fitness images, for ``settings.split == "fitness"`` (None: the schedule).
        on_model: called with each finished model.
    """
    started = time.perf_counter()
    before = state.timings.correction_s or 0.0, state.timings.evaluation_s or 0.0
    budgets = settings.budget_list()
    cost = CostModel(base)
    if any(b.latency is not None for b in budgets):  # measured once per device and batch size, cached in the run
        cache = None if run_dir is None else Path(run_dir) / "latency_table.json"
        cost.latency = latency_table(base, settings.latency_batch_size, settings.latency_device or next(base.parameters()).device,
                                     cache, mlp_multiple=settings.mlp_multiple)
    state.splits = []
    if settings.split == "fitness" and fitness_images is not None:
        search = state.search_settings or SearchSettings()
        state.splits = choose_splits(base, fitness_images, state.elastic_scores(), budgets,
                                     candidates=settings.split_candidates, pca_components=search.pca_components,
                                     batch_size=search.batch_size, mlp_multiple=settings.mlp_multiple, cost=cost)
    scores = state.elastic_scores()
    if run_dir is not None:
        scores.save(Path(run_dir) / settings.scores_file)
        state.scores_file = settings.scores_file
    state.dense = DenseModel(cost.dense_params, cost.dense_flops)
    if evaluation is not None:
        with state.timings.measure("evaluation"):
            state.dense.metrics = evaluation(base)
    save_dir = Path(run_dir) / "models" if run_dir is not None and settings.save_models else None
    state.extracted = extract_models(
        base, scores, budgets, mlp_multiple=settings.mlp_multiple, correction=correction,
        evaluation=evaluation, save_dir=save_dir, spec=state.spec, cost=cost, timings=state.timings, on_model=on_model,
        measure_latency=cost.latency is not None,
    )
    if save_dir is not None:
        for item in state.extracted:
            item.checkpoint = Path(item.checkpoint).relative_to(Path(run_dir)).as_posix()
    post = (state.timings.correction_s or 0.0) - before[0] + (state.timings.evaluation_s or 0.0) - before[1]
    state.timings.add("export", time.perf_counter() - started - post)



def export_from_datamodule(
    state: RunState,
    base: nn.Module,
    datamodule: Any,
    settings: ExportSettings,
    correction: CorrectionSettings,
    evaluation: EvaluationSettings,
    search: SearchSettings,
    run_dir: Optional[str | Path],
    device: Optional[torch.device] = None,
    on_model: Optional[Callable[[ExtractedModel], None]] = None,
) -> None:
    """:func:`export_stage` with its steps' data taken from a DataModule, as ``prune.py`` runs it: calibration images
    (plain views of the pruning data), the evaluation subsets (labeled train and val splits) and the fitness images
    for the splits (the search's)."""
    step = None
    if correction.enabled:
        step = Correction(correction, datamodule.unlabeled_images(correction.num_samples, correction.batch_size))
    evaluate = None
    if evaluation.metrics:
        data = EvalData.from_datamodule(datamodule, evaluation.train_samples, evaluation.val_samples, evaluation.batch_size)
        evaluate = Evaluation(evaluation, data, device)
    images = None
    if settings.split == "fitness":
        images = datamodule.unlabeled_images(search.num_images, search.batch_size).to(device or "cpu")
    export_stage(state, base, settings, run_dir, step, evaluate, images, on_model=on_model)
