"""Stage 3: pruned models at budgets, each through the same steps in a fixed order.

For every budget: resolve the sub-network from the elastic scores -> cut it from the base model
(with weight correction when enabled) -> evaluate it (when enabled) -> save the checkpoint (when
a directory is given). ``prune.py``, ``python -m snapvit_pl.extract``, the Python API and the
benchmarks all go through :func:`extract_models`.
"""
from __future__ import annotations

import copy
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from ..correction import (
    CorrectionSettings, OutputGuard, Reconstruction, compensate_bias_and_prune, correct_and_prune,
    fit_to_dense_and_prune, split_calibration,
)
from ..elastic.budget import Budget, CostModel, check_unique_labels
from ..elastic.ranking import removed_count
from ..elastic.scores import ElasticScores
from ..errors import ConfigError, PruningSpecError
from ..eval.suite import EvalData, EvaluationSettings, evaluate_model
from ..eval.throughput import measure_throughput
from ..models.checkpoint import save_pruned
from ..models.cost import input_shape
from ..models.loading import BackboneSpec
from ..models.surgery import prune_
from ..models.units import prunable_blocks
from .settings import ImportanceSettings
from .state import ExtractedModel, Timings

log = logging.getLogger(__name__)

#: Printed (and written into the report) when a run's models are not corrected.
CORRECTION_HINT = ("the pruned models are not corrected: --correction.enabled true (Python: "
                   "CorrectionSettings(enabled=True)) corrects each one, judged against the model as cut on held-out "
                   "images (seconds per model on a GPU, minutes at full size on a CPU), worth the most where pruning "
                   "costs the most accuracy (the documentation site, page 'The method', section 4)")

#: The hint when ``enabled: auto`` left a headless backbone's models as cut.
HEADLESS_HINT = ("the pruned models are not corrected: the backbone has no classifier, and correction.enabled auto "
                 "leaves a headless backbone's models as cut (of the two self-supervised development models, the "
                 "correction raised one's k-NN accuracy and lowered the other's where no label-free check could see "
                 "it); --correction.enabled true corrects them, and the report then shows each model as cut beside "
                 "it (the documentation site, page 'The method', section 4)")

#: The hint when the scores were ranked for corrected models (``GaussNewtonGreedy(correction_aware=True)``).
CORRECTION_AWARE_HINT = ("the scores were ranked for corrected models (the scorer's correction_aware: true) but the "
                         "pruned models are not corrected: correction enabled (--correction.enabled true) corrects "
                         "each one, or rank without correction_aware")


def correction_record(settings: CorrectionSettings, applied: bool, device: torch.device | str,
                      ranked_for_correction: bool = False, headless: bool = False) -> dict[str, Any]:
    """What a run did about the weight correction, for its report: the setting, whether it ran, and how to turn it
    on when it did not (``ranked_for_correction``: the scores assume corrected models, which the hint then says;
    ``headless``: ``auto`` left a backbone without a classifier uncorrected)."""
    record: dict[str, Any] = {"enabled": settings.enabled, "applied": applied, "method": settings.method,
                              "device": str(device)}
    if applied:
        record["num_samples"] = settings.num_samples
        if settings.method == "dense_fit":
            record["reconstruct_steps"] = settings.steps_on(device)
    else:
        record["hint"] = CORRECTION_AWARE_HINT if ranked_for_correction else \
            HEADLESS_HINT if headless and settings.enabled == "auto" else CORRECTION_HINT
    return record


#: Accuracy (a fraction) a model may lose against the dense model before a run without correction says how to turn
#: it on: below it, nothing measured would change.
HINT_LOSS = 0.005


def pruning_costs_accuracy(dense: Optional[dict[str, Any]], items: Sequence[ExtractedModel]) -> bool:
    """Whether some model of ``items`` is more than :data:`HINT_LOSS` below the ``dense`` model's accuracy on some
    ``*_top1`` / ``seg_miou`` metric (True when nothing was evaluated: nothing says it does not)."""
    keys = [k for k in (dense or {}) if k.endswith("_top1") or k == "seg_miou"]
    if not keys or not items or any(item.metrics is None for item in items):
        return True
    return any(dense[k] - item.metrics.get(k, dense[k]) > HINT_LOSS for item in items for k in keys)


class Correction:
    """The correction step, bound to its calibration images: the last ``settings.held_out`` of them set aside before
    anything is fitted, to judge each corrected model against the model as cut (:mod:`snapvit_pl.correction.guard`).
    """

    def __init__(self, settings: CorrectionSettings, images: torch.Tensor):
        self.settings = settings
        self.images, self.held_out = split_calibration(images, settings.held_out)
        self._guard: Optional[tuple[nn.Module, OutputGuard]] = None  # the dense outputs, once per base model

    def guard(self, base: nn.Module) -> Optional[OutputGuard]:
        """The output check against ``base`` on the held-out images (None: none held out)."""
        if not len(self.held_out):
            return None
        if self._guard is None or self._guard[0] is not base:
            device = next(base.parameters()).device
            self._guard = (base, OutputGuard(base, self.held_out.to(device), self.settings.batch_size))
        return self._guard[1]

    def __call__(self, base: nn.Module, subnet, as_cut: Optional[nn.Module] = None
                 ) -> tuple[nn.Module, dict[str, Any]]:
        """A corrected, pruned copy of ``base`` (or ``as_cut``, the model as cut, where the output check keeps it)
        and what was done."""
        s = self.settings
        started = time.perf_counter()
        device = next(base.parameters()).device
        images, held_out = self.images.to(device), self.held_out.to(device)
        if s.method == "bias":
            model = compensate_bias_and_prune(copy.deepcopy(base), subnet, images, batch_size=s.batch_size)
            done = {"method": "bias"}
        elif s.method == "dense_fit":
            count = s.steps_on(images.device)
            steps = Reconstruction(count, s.reconstruct_lr, s.batch_size, patience=s.reconstruct_patience,
                                   seconds=s.reconstruct_seconds) if count else None
            blocks: list[dict[str, Any]] = []
            model = fit_to_dense_and_prune(copy.deepcopy(base), subnet, images, batch_size=s.batch_size,
                                           damping=s.damping, damp_fraction=s.damp_fraction, refit=s.refit,
                                           output_weight=s.output_weight, reconstruct=steps, held_out=held_out,
                                           choices=blocks)
            done = {"method": "dense_fit", "damping": s.damping, "damp_fraction": s.damp_fraction, "refit": s.refit,
                    "output_weight": s.output_weight}
            if steps is not None:
                done["reconstruction"] = {"steps": count, "lr": s.reconstruct_lr, "patience": s.reconstruct_patience,
                                          "blocks": steps.log}
            if blocks:
                done["blocks"] = [{**b, "held_out_error": {k: round(v, 8) for k, v in b["held_out_error"].items()}}
                                  for b in blocks]
        else:
            model = correct_and_prune(copy.deepcopy(base), subnet, images, batch_size=s.batch_size,
                                      damping=s.damping, damp_fraction=s.damp_fraction, block_size=s.block_size)
            done = {"damping": s.damping, "damp_fraction": s.damp_fraction}
        done = {**done, "num_samples": len(images) + len(held_out), "held_out_images": len(held_out)}
        guard = self.guard(base)
        if guard is not None:
            as_cut = as_cut if as_cut is not None else prune_(copy.deepcopy(base), subnet)
            keep, done["output_check"] = guard.choose(as_cut, model)
            done["kept"] = "corrected" if keep else "as cut"
            model = model if keep else as_cut
        else:
            done["kept"] = "corrected"
        return model, {**done, "seconds": round(time.perf_counter() - started, 3)}


class Evaluation:
    """The evaluation step, bound to its data (see :func:`snapvit_pl.eval.suite.evaluate_model`)."""

    def __init__(self, settings: EvaluationSettings, data: EvalData, device: Optional[torch.device] = None,
                 log: Optional[Callable[[str], None]] = None):
        self.settings, self.data, self.device, self.log = settings, data, device, log

    def __call__(self, model: nn.Module) -> dict[str, Any]:
        return evaluate_model(model, self.data, self.settings, device=self.device, log=self.log, count_cost=False)

    def describe(self) -> dict[str, Any]:
        """What the metrics were measured on (recorded with each model, e.g. for its model card)."""
        s = self.settings
        return {"dataset": self.data.dataset, "split": "val", "train_samples": s.train_samples,
                "val_samples": s.val_samples, "knn_k": s.knn_k}


def check_budgets(model: nn.Module, budgets: Sequence[Budget], importance: ImportanceSettings, mlp_multiple: int,
                  cost: Optional[CostModel] = None) -> None:
    """Raise ``PruningSpecError`` now for a budget the keep ratios make unreachable, or one that removes nothing
    (its model would be a copy of the dense one), before the expensive stages.

    Reachability depends on the architecture and the keep ratios (``importance.min_mlp_keep``,
    ``min_head_keep``), not on the scores, so uniform placeholder scores decide it.
    """
    blocks = prunable_blocks(model)
    placeholder = ElasticScores([torch.zeros(b.heads.num_units) for b in blocks],
                                [torch.zeros(b.neurons.num_units) for b in blocks],
                                min_mlp_keep=importance.min_mlp_keep, min_head_keep=importance.min_head_keep)
    cost = cost or CostModel(model)
    for budget in budgets:
        if budget.latency is None or cost.latency is not None:  # a latency target: once its table is measured
            subnet, _, _ = placeholder.subnet(budget, cost, mlp_multiple)
            # (a latency target the dense model meets already is a fair answer on that device: not refused)
            if budget.latency is None and subnet.head_counts == cost.num_heads and \
                    subnet.neuron_counts == cost.num_neurons:
                raise PruningSpecError(f"budget {budget.describe()} removes nothing: its model would be a copy of the "
                                       "dense one (the base model itself); leave it out of export.budgets, or ask for "
                                       "a smaller model")


def removed_share(kept: Sequence[int], dense: Sequence[int]) -> float:
    """Share of the dense model's units (heads or MLP neurons, over all blocks) a model's widths ``kept`` remove."""
    return 1.0 - sum(kept) / sum(dense)


def resolved_model(budget: Budget, scores: ElasticScores, cost: CostModel, mlp_multiple: Optional[int] = None
                   ) -> ExtractedModel:
    """The model of ``budget`` before it is cut: its sub-network, size and ratios, the ratios counted from its widths
    (what the report shows) next to the ones the budget resolved to (``requested_*``).

    When ``mlp_multiple`` rounds the MLP widths away from what the requested ratio keeps, the model records by how
    many neurons (``rounding``: ``extra_neurons`` > 0 kept beyond the request, < 0 removed beyond it); a ratio budget
    that then removes fewer neurons than it asks also logs a warning. A cost budget is met with the rounding counted
    in (its bisection measures the rounded widths).
    """
    subnet, mlp_ratio, head_ratio = scores.subnet(budget, cost, mlp_multiple)
    multiple = scores.mlp_multiple if mlp_multiple is None else mlp_multiple
    total = sum(cost.num_neurons)
    extra = sum(subnet.neuron_counts) - (total - removed_count(mlp_ratio, total))
    rounding = {"mlp_multiple": multiple, "extra_neurons": extra} if extra != 0 else None
    item = ExtractedModel(budget.label(), budget, subnet, removed_share(subnet.neuron_counts, cost.num_neurons),
                          removed_share(subnet.head_counts, cost.num_heads), cost.params(subnet), cost.flops(subnet),
                          requested_mlp_ratio=mlp_ratio, requested_head_ratio=head_ratio, rounding=rounding)
    if extra > 0 and not budget.is_cost:
        log.warning("budget %s: export.mlp_multiple %d keeps %d MLP neuron(s) more than mlp_ratio %.4g asks (widths "
                    "rounded to multiples, never below the protected neurons): %.4f of the MLP neurons removed, not "
                    "%.4f", budget.describe(), multiple, extra, mlp_ratio, item.mlp_ratio, mlp_ratio)
    return item


def throughput_alone(base: nn.Module, items: Sequence[ExtractedModel], settings: EvaluationSettings,
                     device: Optional[torch.device], dense: bool = True) -> dict[str, dict[str, Any]]:
    """The throughput metric of the dense model (key ``dense``, with ``dense``) and of each model of ``items``, timed
    one after the other by this process alone: a multi-process export times them so, once the other processes have
    finished (timed side by side, processes sharing a machine's cores slow each other down: the dense model's
    images/s described two processes, not the model)."""
    only = replace(settings, metrics=["throughput"])
    timed = {"dense": evaluate_model(base, EvalData(), only, device=device, count_cost=False)} if dense else {}
    for item in items:
        model = prune_(copy.deepcopy(base), item.subnet)  # (a corrected model has the same shapes, so the same speed)
        timed[item.label] = evaluate_model(model, EvalData(), only, device=device, count_cost=False)
    return timed


def with_timed(metrics: Optional[dict[str, Any]], timed: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` with the throughput of :func:`throughput_alone` added (their ``timings_s`` merged)."""
    merged = {**(metrics or {}), **{k: v for k, v in timed.items() if k != "timings_s"}}
    merged["timings_s"] = {**(metrics or {}).get("timings_s", {}), **timed.get("timings_s", {})}
    return merged


def refuse_existing(save_dir: str | Path, labels: Sequence[str]) -> None:
    """Raise ``ConfigError`` when ``save_dir`` already holds a model of one of ``labels``."""
    existing = [label for label in labels if (Path(save_dir) / label).exists()]
    if existing:
        raise ConfigError(f"{save_dir} already holds {', '.join(existing)}; pass --overwrite true to replace them "
                          "or choose another output directory")


def extract_models(
    base: nn.Module,
    scores: ElasticScores,
    budgets: Sequence[Budget | ExtractedModel],
    *,
    mlp_multiple: Optional[int] = None,
    correction: Optional[Correction] = None,
    evaluation: Optional[Evaluation] = None,
    save_dir: Optional[str | Path] = None,
    spec: Optional[BackboneSpec] = None,
    overwrite: bool = True,
    keep_models: bool = False,
    cost: Optional[CostModel] = None,
    timings: Optional[Timings] = None,
    on_model: Optional[Callable[[ExtractedModel], None]] = None,
    measure_latency: bool = False,
) -> list[ExtractedModel]:
    """Cut, post-process and save one pruned model per budget, in that order.

    Every budget is resolved to its sub-network first, so a budget that cannot be met fails before any
    model is written.

    Args:
        base: the dense base model the scores belong to (never modified).
        scores: its elastic scores.
        budgets: the budgets to cut, or their models already resolved (:func:`resolved_model`: each budget resolved
            once per run).
        mlp_multiple: round MLP widths to this multiple (default: the run's, recorded in ``scores``).
        correction: weight correction applied while cutting (None: plain surgery).
        evaluation: evaluation of each model (None: not evaluated).
        save_dir: write each model to ``save_dir/<label>/`` (None: not saved).
        spec: how the base model is built (recorded in each checkpoint; default ``scores.base``).
        overwrite: replace existing checkpoints.
        keep_models: keep the pruned modules in the results (else released once saved, to free memory).
        cost: the base model's :class:`CostModel`, if already built (with a latency table for latency budgets).
        timings: receives ``correction_s`` and ``evaluation_s``.
        on_model: called with each finished model (progress, logging).
        measure_latency: time each model on the latency table's device and batch size, next to its prediction.
    """
    resolved = [b for b in budgets if isinstance(b, ExtractedModel)]
    budgets = [b.budget if isinstance(b, ExtractedModel) else Budget.parse(b) for b in budgets]
    check_unique_labels(budgets)  # one model per folder, so the report describes what is on disk
    if save_dir is not None and spec is None:
        if not scores.base.get("model_name"):
            raise ConfigError("saving pruned checkpoints needs the base model's BackboneSpec: pass spec=")
        spec = BackboneSpec.from_dict(scores.base)
    timings = timings if timings is not None else Timings()
    cost = cost or CostModel(base)
    items = resolved if len(resolved) == len(budgets) else [  # all before any cut or write
        resolved_model(budget, scores, cost, mlp_multiple) for budget in budgets]
    if save_dir is not None and not overwrite:
        refuse_existing(save_dir, [item.label for item in items])
    extracted = []
    for item in items:
        subnet = item.subnet
        # the model as cut: the result without correction; with it, what the report shows beside the corrected model
        # and what the output check compares it with (a correction that holds nothing out and is not evaluated
        # needs none)
        as_cut = prune_(copy.deepcopy(base), subnet) if correction is None or evaluation is not None or len(
            getattr(correction, "held_out", ())) else None
        if correction is not None and evaluation is not None:
            with timings.measure("evaluation"):
                item.metrics_as_cut = evaluation(as_cut)
        if correction is not None:
            with timings.measure("correction"):
                item.model, item.correction = correction(base, subnet, as_cut=as_cut)
        else:
            item.model = as_cut
        del as_cut
        if evaluation is not None:
            if item.metrics_as_cut is not None and item.correction.get("kept") == "as cut":
                item.metrics = item.metrics_as_cut  # the output check kept the model as cut: the same weights
            else:
                with timings.measure("evaluation"):
                    item.metrics = evaluation(item.model)
        if measure_latency and cost.latency is not None:
            table = cost.latency
            item.predicted_latency_ms = table.predict(subnet)
            item.latency_ms = 1000 * measure_throughput(item.model, input_shape(item.model), table.batch_size,
                                                        device=table.device).median_batch_seconds
        if save_dir is not None:
            relative = Path(save_dir) / item.label
            extra = {**item.checkpoint_record(), "base_fingerprint": scores.fingerprint, "base_spec": spec.to_dict()}
            if evaluation is not None and hasattr(evaluation, "describe"):
                extra["evaluated_on"] = evaluation.describe()
            save_pruned(item.model, relative, spec, subnet, overwrite=overwrite,  # base_spec: the teacher of a fine-tune
                        extra=extra)
            item.checkpoint = str(relative)
        if not keep_models:
            item.model = None
        extracted.append(item)
        if on_model is not None:
            on_model(item)
    return extracted
