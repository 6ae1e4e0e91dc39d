"""The export stage and what comes before and after it: the checks a run makes before any work (budgets the keep
ratios cannot reach, latency budgets), cutting (correcting, evaluating, saving) every budget's model, and racing the
split of a budget cut later. Functions over a :class:`~snapvit_pl.pipeline.Pipeline`; its methods call them."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ..correction.guard import is_headless
from ..elastic.budget import Budget, CostModel
from ..elastic.latency import latency_table
from ..errors import ConfigError
from ..models.modes import eval_mode
from ..progress import Progress
from ..search.population import share_by_cost
from .extraction import (
    Correction, Evaluation, check_budgets, correction_record, extract_models, pruning_costs_accuracy,
    refuse_existing, resolved_model,
    throughput_alone, with_timed,
)
from .splits import SplitChoice, choose_splits
from .state import DenseModel, ExtractedModel, Timings
from .tables import percent_label

if TYPE_CHECKING:  # (annotations only)
    from .driver import Pipeline


def check(pipe: "Pipeline") -> None:
    """Refuse now what would fail after the expensive stages: budgets the configured keep ratios
    (``importance.min_mlp_keep`` / ``min_head_keep``) cannot reach, metrics a pruning run cannot measure.

    Raises:
        PruningSpecError, ConfigError: naming the budget or setting.
    """
    if pipe.work.checked:  # once per run (prune.py checks before anything is written, the export callback again)
        return
    s = pipe.settings
    check_budgets(pipe.model, s.export.budgets, s.importance, s.export.mlp_multiple, pipe.cost)
    pipe.work.checked = True
    if "seg" in s.evaluation.metrics and pipe.seg_datamodule is None and not pipe.inputs.has_segmentation():
        raise ConfigError("evaluation.metrics: 'seg' needs segmentation data; give a SegmentationDataModule as "
                          "seg_data (e.g. the offline Fashion-MNIST canvases: --seg_data SegmentationDataModule "
                          "--seg_data.init_args.source fashion_mnist)")


def check_latency(pipe: "Pipeline", device: Optional[torch.device | str] = None) -> None:
    """When a budget asks for latency: measure the latency table now (once; cached in the run directory, reused
    by a resume) and refuse a latency budget it cannot reach, before the expensive stages. Rank 0 only.

    Args:
        device: where the run will compute (default: the model's device); ``export.latency_device`` wins.
    """
    s = pipe.settings
    if pipe.dist.is_main and any(b.latency is not None for b in s.export.budgets):
        check_budgets(pipe.model, s.export.budgets, s.importance, s.export.mlp_multiple,
                      cost_for(pipe, s.export.budgets, device))


def export(pipe: "Pipeline",
    budgets: Optional[Sequence[Budget | dict[str, Any] | str]] = None,
    *,
    models_dir: Optional[str | Path] = None,
    overwrite: bool = True,
    evaluate_dense: bool = True,
) -> list[ExtractedModel]:
    """Cut every budget from the elastic scores: cut -> correct (``correction.enabled``) -> evaluate
    (``evaluation.metrics``) -> save, in that order; the dense model is evaluated too. Under DDP every rank
    calls this: each takes its share of the models (and of the dense evaluation), writes its models into the
    (shared) run directory, and every rank returns all of them, as one process would.

    Args:
        budgets: the budgets (default ``export.budgets``).
        models_dir: where each model goes (``<models_dir>/<label>/``); default ``<run_dir>/models`` when
            ``export.save_models``, else nothing is saved.
        overwrite: replace models already there (else refuse before any is written).
        evaluate_dense: also evaluate the dense model (the report's reference row).
    """
    pipe.begin_stage("export")
    with pipe.peak_memory("export"):
        return _export(pipe, budgets, models_dir, overwrite, evaluate_dense)


def _export(pipe: "Pipeline", budgets: Optional[Sequence[Budget | dict[str, Any] | str]], models_dir: Optional[str | Path],
            overwrite: bool, evaluate_dense: bool) -> list[ExtractedModel]:
    s = pipe.settings
    started = time.perf_counter()
    budgets = s.export.budgets if budgets is None else [Budget.parse(b) for b in budgets]
    cost = cost_for(pipe, budgets, shared=True)
    race_unrecorded(pipe, budgets, cost)
    scores = pipe.elastic_scores()
    # every budget resolved once (a budget that cannot be met fails on every rank, before anything is written),
    # then the models (and the dense evaluation) shared across ranks by their cost
    resolved = [resolved_model(b, scores, cost, s.export.mlp_multiple) for b in budgets]
    flops = [item.flops / cost.dense_flops for item in resolved]
    pipe.hold_folder()
    if models_dir is None and pipe.run_dir is not None and s.export.save_models:
        models_dir = pipe.run_dir / "models"
    if models_dir is not None and not overwrite:  # on every rank, before any work
        refuse_existing(models_dir, [b.label() for b in budgets])
    dense_job = evaluate_dense and s.evaluation.metrics
    # several processes: the throughput is timed after the others, by the first process alone (throughput_alone)
    apart = pipe.dist.world_size > 1 and "throughput" in s.evaluation.metrics
    settings = replace(s.evaluation, metrics=[m for m in s.evaluation.metrics if m != "throughput"]) if apart else \
        s.evaluation
    owner = share_by_cost(flops + ([1.0] if dense_job else []), pipe.dist.world_size)
    mine = [item for item, r in zip(resolved, owner) if r == pipe.dist.rank]
    correction = None
    # auto: where the model has a classifier and the run has calibration images (true without them is refused)
    corrected = s.correction.active(pipe.model) and (s.correction.enabled is True or pipe.inputs.has_calibration_images())
    pipe.state.correction = correction_record(s.correction, corrected, pipe.device,
                                              bool(getattr(s.importance.scorer, "correction_aware", False)),
                                              headless=is_headless(pipe.model))
    if corrected and mine:
        correction = Correction(s.correction, pipe.inputs.calibration_images(s.correction))
    data = pipe.inputs.evaluation_data(settings) if mine or (dense_job and owner[-1] == pipe.dist.rank) else None
    evaluation = Evaluation(settings, data, pipe.device) if data is not None else None
    pipe.state.dense = DenseModel(cost.dense_params, cost.dense_flops)
    timings = Timings()
    dense_metrics = None
    if evaluation is not None and dense_job and owner[-1] == pipe.dist.rank:
        with timings.measure("evaluation"):
            dense_metrics = evaluation(pipe.model)
    with Progress("export", len(budgets), pipe.progress_mode(), unit="model") as bar:  # (every process's models)
        def finished(item: ExtractedModel) -> None:
            bar.update(model=item.label, **{percent_label(k): round(100 * v, 2)
                                            for k, v in (item.metrics or {}).items() if k.endswith("_top1")})

        extracted = extract_models(
            pipe.model, scores, mine, mlp_multiple=s.export.mlp_multiple, correction=correction,
            evaluation=evaluation, save_dir=models_dir, spec=pipe.spec, overwrite=overwrite, cost=cost,
            timings=timings, on_model=finished, measure_latency=cost.latency is not None,
        )
        shares = pipe.dist.gather((extracted, dense_metrics))  # every rank's models, in rank order
        bar.update(len(budgets) - len(mine))  # the other processes' models, done too
    done = {item.label: item for share, _ in shares for item in share}
    pipe.state.extracted = [done[b.label()] for b in budgets]
    used = next((item.correction["num_samples"] for item in pipe.state.extracted if item.correction), None)
    if used is not None and used < s.correction.num_samples:  # the report says how many, and why fewer
        pipe.state.correction.update(num_samples=used, num_samples_asked=s.correction.num_samples,
                                     fewer_because=pipe.inputs.fewer_calibration_images(used))
    pipe.state.dense.metrics = next((m for _, m in shares if m is not None), None)
    if pipe.state.correction.get("hint") and not pruning_costs_accuracy(pipe.state.dense.metrics,
                                                                         pipe.state.extracted):
        del pipe.state.correction["hint"]  # measured: no model loses what a correction could give back
    if apart:
        timed = pipe.dist.gather(throughput_alone(pipe.model, pipe.state.extracted, s.evaluation, pipe.device,
                                                  bool(dense_job)) if pipe.dist.is_main else None)[0]
        for item in pipe.state.extracted:
            item.metrics = with_timed(item.metrics, timed[item.label])
        if dense_job:
            pipe.state.dense.metrics = with_timed(pipe.state.dense.metrics, timed["dense"])
    for stage in ("correction", "evaluation"):  # this process's wall clock, as every stage's
        if getattr(timings, f"{stage}_s") is not None:
            pipe.state.timings.add(stage, getattr(timings, f"{stage}_s"))
    if models_dir is not None and pipe.run_dir is not None:
        for item in pipe.state.extracted:
            path = Path(item.checkpoint)
            if path.is_relative_to(pipe.run_dir):
                item.checkpoint = path.relative_to(pipe.run_dir).as_posix()
    own = (timings.correction_s or 0.0) + (timings.evaluation_s or 0.0)  # this process's
    pipe.state.timings.add("export", time.perf_counter() - started - own)
    pipe.end_stage("export")
    return pipe.state.extracted


def unrecorded(pipe: "Pipeline", budgets: Sequence[Budget], cost: Optional[CostModel] = None) -> list[Budget]:
    """The cost budgets among ``budgets`` whose split the elastic scores do not record (cut later, they take
    a split interpolated between the recorded ones unless :func:`race_unrecorded` races them)."""
    cost = cost or pipe.cost
    return [b for b in budgets if (point := b.cost_point(cost)) is not None and not pipe.work.splits.records(*point)]


def race_unrecorded(pipe: "Pipeline", budgets: Sequence[Budget], cost: Optional[CostModel] = None) -> list[SplitChoice]:
    """Race the split of every cost budget the scores do not record, as a run asked for it would have (its
    fitness images, ``split_images``, ``split_candidates`` and ``split_step``: recorded in the scores, see
    :meth:`Pipeline.from_scores`), and record it; nothing without fitness images or with ``export.split: schedule``."""
    missing = unrecorded(pipe, budgets, cost)
    if not missing or pipe.settings.export.split != "fitness" or not pipe.inputs.has_fitness_images():
        return []
    started = time.perf_counter()
    with eval_mode(pipe.model), pipe.peak_memory("splits"):
        choices = choose_splits(
            pipe.model, pipe.fitness_images(), pipe.elastic_scores(), missing, pipe.settings.search,
            replace(pipe.settings.export, split_grid=0.0), cost or pipe.cost, pipe.progress_mode(), fitness=pipe.fitness(),
            rank=pipe.dist.rank, world_size=pipe.dist.world_size, all_gather=pipe.dist.all_gather)
    for choice in choices:
        pipe.work.splits.add(choice.metric, choice.keep, choice.head_ratio)
    pipe.state.splits = [*(pipe.state.splits or []), *choices]
    pipe.state.timings.add("splits", time.perf_counter() - started)
    return choices


def cost_for(pipe: "Pipeline", budgets: Sequence[Budget], device: Optional[torch.device | str] = None,
              shared: bool = False) -> CostModel:
    """The cost model, with the latency table of the target device when a budget asks for latency (measured
    once, by rank 0, cached in the run directory). ``shared``: called on every rank (the export), which all take
    rank 0's table so that every rank cuts the same models; the start-up check runs on rank 0 alone."""
    cost = pipe.cost
    if any(b.latency is not None for b in budgets):
        if cost.latency is None and pipe.dist.is_main:
            e = pipe.settings.export
            pipe.hold_folder()
            cache = e.latency_table or (None if pipe.run_dir is None else pipe.run_dir / "latency_table.json")
            cost.latency = latency_table(pipe.model, e.latency_batch_size, e.latency_device or device or pipe.device,
                                         cache, mlp_multiple=e.mlp_multiple)
        if shared:
            cost.latency = pipe.dist.gather(cost.latency)[0]
    return cost
